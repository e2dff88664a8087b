//! The README and the guide under `docs/`: every page's Rust snippets are compiled as
//! doctests (a line per page in `src/lib.rs`), and every relative link reaches a file and,
//! when it names one, a heading of it (GitHub's anchors).

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn guide_pages() -> Vec<PathBuf> {
    let mut pages: Vec<PathBuf> = fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|entry| entry.expect("docs/ entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    pages.sort();
    pages
}

/// The lines outside fenced code blocks.
fn prose(text: &str) -> impl Iterator<Item = &str> {
    let mut fenced = false;
    text.lines().filter(move |line| {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            return false;
        }
        !fenced
    })
}

/// GitHub's anchor for a heading: lower case, punctuation dropped (but `-` and `_`),
/// spaces made `-`, repeats numbered.
fn anchors(text: &str) -> HashSet<String> {
    let mut seen = HashSet::new();
    for line in prose(text) {
        let Some(heading) = line.strip_prefix('#') else {
            continue;
        };
        let heading = heading.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        let slug: String = heading
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let mut anchor = slug.clone();
        let mut n = 0;
        while seen.contains(&anchor) {
            n += 1;
            anchor = format!("{slug}-{n}");
        }
        seen.insert(anchor);
    }
    seen
}

/// The targets of the inline links `[text](target)` outside code blocks.
fn links(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for line in prose(text) {
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let end = rest.find(')').unwrap_or(rest.len());
            found.push(rest[..end].to_string());
            rest = &rest[end..];
        }
    }
    found
}

#[test]
fn every_guide_page_is_compiled_as_doctests() {
    let lib = fs::read_to_string(root().join("src/lib.rs")).expect("src/lib.rs");
    assert!(lib.contains(r#"include_str!("../README.md")"#));
    for page in guide_pages() {
        let name = page.file_name().unwrap().to_string_lossy();
        let include = format!(r#"include_str!("../docs/{name}")"#);
        assert!(
            lib.contains(&include),
            "docs/{name} is not compiled as doctests: add `#[doc = {include}] struct ...;` \
             to the doctests module of src/lib.rs"
        );
    }
}

#[test]
fn relative_links_reach_their_files_and_headings() {
    let mut pages = guide_pages();
    pages.push(root().join("README.md"));
    let mut broken = Vec::new();
    for page in &pages {
        let text = fs::read_to_string(page).expect("page");
        for link in links(&text) {
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = link.split_once('#').unwrap_or((&link, ""));
            let target = if file.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap().join(file)
            };
            if !target.exists() {
                broken.push(format!("{}: {link}: no such file", page.display()));
                continue;
            }
            if anchor.is_empty() {
                continue;
            }
            let target_text = fs::read_to_string(&target).expect("link target");
            if !anchors(&target_text).contains(anchor) {
                broken.push(format!("{}: {link}: no such heading", page.display()));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn github_anchors() {
    let text = "# Redis: `rediss://` and an ACL user\n## The request-level fault soak: \
                `fencelock chaos --soak`\n```\n# not a heading\n```\n## etcd or Redis: what \
                each promises\n## etcd or Redis: what each promises\n";
    let anchors = anchors(text);
    for anchor in [
        "redis-rediss-and-an-acl-user",
        "the-request-level-fault-soak-fencelock-chaos---soak",
        "etcd-or-redis-what-each-promises",
        "etcd-or-redis-what-each-promises-1",
    ] {
        assert!(anchors.contains(anchor), "{anchor}: {anchors:?}");
    }
    assert!(!anchors.contains("not-a-heading"), "{anchors:?}");
}
