//! The documentation's links: every relative link and image in the README and under `docs/`
//! points at a file or directory that exists, and every `#fragment` at a heading of the
//! Markdown file it names (or of the file it is in).

use std::fs;
use std::path::{Path, PathBuf};

/// GitHub's anchor of a heading: lowercase, every character other than a letter, a digit, a
/// space, `-` or `_` dropped, spaces made `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The lines of a Markdown text outside fenced code blocks.
fn prose_lines(text: &str) -> Vec<&str> {
    let mut fenced = false;
    let mut lines = Vec::new();
    for line in text.lines() {
        let start = line.trim_start();
        if start.starts_with("```") || start.starts_with("~~~") {
            fenced = !fenced;
        } else if !fenced {
            lines.push(line);
        }
    }
    lines
}

/// The anchors of a Markdown text's headings (`#` to `######`, then a space).
fn anchors(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for line in prose_lines(text) {
        let title = line.trim_start_matches('#');
        let level = line.len() - title.len();
        if (1..=6).contains(&level) && title.starts_with(' ') {
            found.push(slug(title.trim_end_matches('#')));
        }
    }
    found
}

/// Every link or image target, the `target` of `](target)`, in a Markdown text's prose.
fn targets(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for line in prose_lines(text) {
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            if let Some(end) = rest.find(')') {
                found.push(rest[..end].trim().to_string());
                rest = &rest[end + 1..];
            }
        }
    }
    found
}

/// Every `*.md` file under `dir`, at any depth.
fn markdown_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            markdown_files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "md") {
            out.push(path);
        }
    }
}

/// Whether `target`, written in the Markdown file `file`, names something that exists.
fn resolves(file: &Path, target: &str) -> bool {
    let (path, fragment) = match target.split_once('#') {
        Some((path, fragment)) => (path, Some(fragment)),
        None => (target, None),
    };
    let dest = if path.is_empty() {
        file.to_path_buf()
    } else {
        file.parent().expect("a file's directory").join(path)
    };
    if !dest.exists() {
        return false;
    }
    match fragment {
        Some(fragment) if dest.extension().is_some_and(|ext| ext == "md") => {
            fs::read_to_string(&dest)
                .is_ok_and(|text| anchors(&text).iter().any(|anchor| anchor == fragment))
        }
        _ => true,
    }
}

/// The repository's root (the tests crate is one of its directories).
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the repository root")
        .to_path_buf()
}

#[test]
fn every_relative_link_in_the_readme_and_docs_resolves() {
    let root = repo_root();
    let mut files = vec![root.join("README.md")];
    markdown_files(&root.join("docs"), &mut files);
    files.sort();
    let mut broken = Vec::new();
    for file in &files {
        let text =
            fs::read_to_string(file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
        for target in targets(&text) {
            let external = ["http:", "https:", "mailto:"]
                .iter()
                .any(|scheme| target.starts_with(scheme));
            if !external && !resolves(file, &target) {
                let shown = file.strip_prefix(&root).unwrap_or(file);
                broken.push(format!("{}: {target}", shown.display()));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "{} relative link(s) in the README and docs/ lead nowhere (a missing file, or no heading \
         with that anchor):\n{}",
        broken.len(),
        broken.join("\n")
    );
}

/// Every metric the service records is in the operating guide's table, and its help text is
/// a sentence: names come from one definition per crate, so a metric added there and not
/// documented fails here.
#[test]
fn every_metric_is_in_the_operating_guide() {
    let guide = fs::read_to_string(repo_root().join("docs/operating/metrics.md")).unwrap();
    let missing: Vec<&str> = sendledger_node::metric_definitions::all()
        .map(|m| m.name)
        .filter(|name| {
            !guide.contains(&format!("`{name}`")) && !guide.contains(&format!("`{name}{{"))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "metrics missing from docs/operating/metrics.md: {missing:?}"
    );
    for m in sendledger_node::metric_definitions::all() {
        assert!(m.name.starts_with("sendledger_"), "{}", m.name);
        assert!(
            m.help.ends_with('.') || m.help.ends_with(')'),
            "{}: {}",
            m.name,
            m.help
        );
    }
}
