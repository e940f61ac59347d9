//! The layout stays as `docs/architecture.md` describes it: no module of a crate imports one
//! that imports it back, and no source file's code (its unit tests apart) grows past what a
//! reader takes in at once.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The most lines of code a source file of `crates/` holds, its `#[cfg(test)] mod tests`
/// apart.
const MAX_CODE_LINES: usize = 800;

fn crates_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the repository root")
        .join("crates")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// A file's code: its text up to its unit tests, comments dropped.
fn code(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap();
    let code = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => &text,
    };
    code.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level module a file of `src` belongs to (`ingest/jobs.rs` → `ingest`), or `None`
/// for the crate root.
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (!matches!(name, "lib" | "main")).then(|| name.to_string())
}

/// The modules of the crate that `code` names through `crate::`.
fn imports(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for part in group[..end].split(',') {
                let name: String = part
                    .trim()
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                found.insert(name);
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            found.insert(name);
        }
    }
    found
}

/// The circles of `graph`: every set of two or more modules that reach each other.
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    let reach = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(m) = todo.pop() {
            for next in graph.get(&m).into_iter().flatten() {
                if graph.contains_key(next) && seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|m| (m, reach(m))).collect();
    let mut found: Vec<BTreeSet<String>> = Vec::new();
    for (m, from_m) in &reached {
        let circle: BTreeSet<String> = from_m
            .iter()
            .filter(|other| *other != *m && reached[other].contains(*m))
            .cloned()
            .chain([(*m).clone()])
            .collect();
        if circle.len() > 1 && !found.contains(&circle) {
            found.push(circle);
        }
    }
    found
}

#[test]
fn no_module_of_a_crate_imports_one_that_imports_it_back() {
    let mut all = Vec::new();
    for entry in fs::read_dir(crates_dir()).unwrap() {
        let src = entry.unwrap().path().join("src");
        if !src.is_dir() {
            continue;
        }
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for file in &files {
            let Some(module) = module_of(&src, file) else {
                continue;
            };
            let mut uses = imports(&code(file));
            uses.remove(&module);
            graph.entry(module).or_default().extend(uses);
        }
        for circle in circles(&graph) {
            all.push(format!("{}: {circle:?}", src.display()));
        }
    }
    assert!(
        all.is_empty(),
        "modules importing each other:\n{}",
        all.join("\n")
    );
}

#[test]
fn no_source_file_holds_more_than_800_lines_of_code() {
    let mut files = Vec::new();
    rust_files(&crates_dir(), &mut files);
    let long: Vec<String> = files
        .iter()
        .map(|f| (f, code(f).lines().count()))
        .filter(|(_, n)| *n > MAX_CODE_LINES)
        .map(|(f, n)| format!("{}: {n}", f.display()))
        .collect();
    assert!(
        long.is_empty(),
        "split these along their seams (docs/architecture.md):\n{}",
        long.join("\n")
    );
}

/// The circle check finds what it is about: the modules of a circle, and none other.
#[test]
fn the_layout_checks_find_a_circle() {
    let graph = BTreeMap::from([
        (
            "a".to_string(),
            imports("use crate::b::X; use crate::{c, d::Y};"),
        ),
        ("b".to_string(), imports("use crate::c::Z;")),
        ("c".to_string(), imports("fn f() { crate::a::g() }")),
        ("d".to_string(), BTreeSet::new()),
    ]);
    assert_eq!(
        graph["a"],
        BTreeSet::from(["b".into(), "c".into(), "d".into()])
    );
    assert_eq!(
        circles(&graph),
        vec![BTreeSet::from(["a".into(), "b".into(), "c".into()])]
    );
}
