//! The scripts a fresh machine starts with (`scripts/test`, `scripts/demo`): their checks run
//! against fake filesystem roots, so what they decide to install is tested without installing.

use std::path::Path;
use std::process::Command;

/// Runs `libclang_present ROOT` of `scripts/prereqs_lib.sh` against a temporary root holding
/// only `files` (empty files at these paths below it).
fn libclang_present(files: &[&str]) -> bool {
    let root = tempfile::tempdir().unwrap();
    for file in files {
        let path = root.path().join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, b"").unwrap();
    }
    let lib = Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../scripts/prereqs_lib.sh"
    ));
    let out = Command::new("bash")
        .arg("-c")
        .arg(r#"set -euo pipefail; source "$1"; libclang_present "$2""#)
        .arg("bash")
        .arg(lib)
        .arg(root.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.is_empty(), "{files:?}: {stderr}");
    match out.status.code() {
        Some(0) => true,
        Some(1) => false,
        other => panic!("{files:?}: exit {other:?}"),
    }
}

/// libclang counts as present exactly where bindgen (clang-sys) would load it from; the
/// libclang-cpp library alone, or libclang outside the directories searched, does not.
#[test]
fn libclang_is_found_where_bindgen_loads_it_from() {
    assert!(!libclang_present(&[]));
    assert!(!libclang_present(&[
        "usr/lib/x86_64-linux-gnu/libclang-cpp.so.14"
    ]));
    assert!(!libclang_present(&["usr/lib/llvm-14/lib/libclang-cpp.so"]));
    assert!(!libclang_present(&["opt/llvm/lib/libclang.so"]));
    assert!(!libclang_present(&["usr/lib/llvm-14/lib/libclangAST.a"]));
    for present in [
        "usr/lib/llvm-14/lib/libclang.so",
        "usr/lib/llvm-14/lib/libclang-14.so",
        "usr/lib/x86_64-linux-gnu/libclang-14.so.1",
        "usr/lib/x86_64-linux-gnu/libclang.so.1",
        "usr/lib64/libclang.so",
        "usr/local/lib/libclang.so",
        "usr/local/llvm18/lib/libclang.so.18.1",
    ] {
        assert!(libclang_present(&[present]), "{present}");
        assert!(
            libclang_present(&[present, "usr/lib/x86_64-linux-gnu/libclang-cpp.so.14"]),
            "{present} next to libclang-cpp"
        );
    }
}
