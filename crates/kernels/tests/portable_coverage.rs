//! Keeps docs/portable-coverage.md true: its count and its list of missing operators
//! must be what `Registry::with_defaults()` covers of the portable library's operators
//! (docs/portable-functions.txt, from executorch 1.5.1's functions.yaml).

use std::collections::BTreeSet;
use std::path::PathBuf;

use etch_kernels::Registry;

fn docs() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs")
}

fn read(name: &str) -> String {
    let path = docs().join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The lines of the fenced block that follows `marker` in `text`.
fn block_after<'a>(text: &'a str, marker: &str) -> Vec<&'a str> {
    let start = text
        .find(marker)
        .unwrap_or_else(|| panic!("docs/portable-coverage.md has no `{marker}`"));
    text[start..]
        .lines()
        .skip_while(|l| !l.starts_with("```"))
        .skip(1)
        .take_while(|l| !l.starts_with("```"))
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect()
}

#[test]
fn the_coverage_page_matches_the_registry() {
    let portable = read("portable-functions.txt");
    let portable: Vec<&str> = portable
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert_eq!(
        portable.len(),
        209,
        "executorch 1.5.1 lists 209 portable operators"
    );
    let registry = Registry::with_defaults();
    let missing: BTreeSet<&str> = portable
        .iter()
        .copied()
        .filter(|name| registry.get(name).is_none())
        .collect();
    let covered = portable.len() - missing.len();

    let page = read("portable-coverage.md");
    let summary = format!("**{covered} of the {}**", portable.len());
    let listed: BTreeSet<&str> = block_after(&page, "<!-- missing operators -->")
        .into_iter()
        .collect();
    let expected_block = missing.iter().copied().collect::<Vec<_>>().join("\n");
    assert!(
        page.contains(&summary),
        "docs/portable-coverage.md should say {summary}"
    );
    assert_eq!(
        listed, missing,
        "docs/portable-coverage.md: the block after `<!-- missing operators -->` should be\n{expected_block}"
    );
}
