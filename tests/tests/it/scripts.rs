//! The scripts a fresh machine starts with (`scripts/test`, `scripts/demo`): their checks
//! (libclang, json-server) run against fake filesystem roots, so what they decide to install is
//! tested without installing.

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

/// Runs `json_server_present PREFIX 0.17.4` of `scripts/prereqs_lib.sh` against a temporary npm
/// prefix holding `files` (path and content, below it); the `.bin/json-server` link is
/// executable.
fn json_server_present(files: &[(&str, &str)]) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let prefix = tempfile::tempdir().unwrap();
    for (file, content) in files {
        let path = prefix.path().join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, content).unwrap();
        if file.ends_with(".bin/json-server") {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
    }
    let lib = Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../scripts/prereqs_lib.sh"
    ));
    let out = Command::new("bash")
        .arg("-c")
        .arg(r#"set -euo pipefail; source "$1"; json_server_present "$2" 0.17.4"#)
        .arg("bash")
        .arg(lib)
        .arg(prefix.path())
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

/// json-server counts as installed only when the pinned version is there with its command, so
/// that `scripts/prereqs` installs it on a fresh machine and replaces another version.
#[test]
fn json_server_is_installed_only_at_the_pinned_version() {
    let bin = ("node_modules/.bin/json-server", "#!/usr/bin/env node\n");
    let manifest = |version: &str| {
        format!("{{\n  \"name\": \"json-server\",\n  \"version\": \"{version}\",\n  \"main\": \"lib/server/index.js\"\n}}\n")
    };
    let pinned = manifest("0.17.4");
    let other = manifest("1.0.0-beta.3");
    let lookalike = manifest("0.17.41");
    let dotless = manifest("0x17y4");
    assert!(!json_server_present(&[]));
    assert!(!json_server_present(&[bin]));
    assert!(!json_server_present(&[(
        "node_modules/json-server/package.json",
        &pinned
    )]));
    assert!(!json_server_present(&[
        bin,
        ("node_modules/json-server/package.json", &other)
    ]));
    assert!(!json_server_present(&[
        bin,
        ("node_modules/json-server/package.json", &lookalike)
    ]));
    assert!(!json_server_present(&[
        bin,
        ("node_modules/json-server/package.json", &dotless)
    ]));
    assert!(json_server_present(&[
        bin,
        ("node_modules/json-server/package.json", &pinned)
    ]));
}
