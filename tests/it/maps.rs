//! The maps stay true: every module a crate declares is named in the map
//! its `lib.rs` opens with, so a reader who starts there sees all of it.

use std::path::Path;

/// The crate roots whose opening comment is their map.
fn crate_roots() -> Vec<std::path::PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut roots = vec![root.join("src/lib.rs")];
    let mut crates: Vec<_> = std::fs::read_dir(root.join("crates"))
        .unwrap()
        .map(|e| e.unwrap().path().join("src/lib.rs"))
        .filter(|p| p.exists())
        .collect();
    crates.sort();
    roots.extend(crates);
    roots
}

/// The modules a file declares at its top level (`mod x;`, `pub mod x;`,
/// `pub(crate) mod x;`, `mod x {`), with the line each is on.
fn declared(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| !l.starts_with(' ') && !l.starts_with("//"))
        .filter_map(|l| {
            let rest = l
                .strip_prefix("pub mod ")
                .or_else(|| l.strip_prefix("pub(crate) mod "))
                .or_else(|| l.strip_prefix("mod "))?;
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            (!name.is_empty() && name != "tests").then_some(name)
        })
        .collect()
}

/// Whether the map (the `//!` lines) names `module` as a whole word.
fn named(map: &str, module: &str) -> bool {
    let word = |c: char| c.is_alphanumeric() || c == '_';
    map.match_indices(module).any(|(i, _)| {
        let before = map[..i].chars().next_back();
        let after = map[i + module.len()..].chars().next();
        !before.is_some_and(word) && !after.is_some_and(word)
    })
}

#[test]
fn every_declared_module_is_named_in_its_crates_map() {
    let mut missing = Vec::new();
    for lib in crate_roots() {
        let text = std::fs::read_to_string(&lib).unwrap();
        let map: String = text
            .lines()
            .filter(|l| l.starts_with("//!"))
            .collect::<Vec<_>>()
            .join("\n");
        for module in declared(&text) {
            if !named(&map, &module) {
                missing.push(format!("{}: {module}", lib.display()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "modules missing from their crate's map (the //! comment at the top of lib.rs):\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_map_check_sees_a_missing_module() {
    let text =
        "//! A map naming `client` and fanout.\npub mod client;\npub mod fanout;\nmod proto;\n";
    let map = "//! A map naming `client` and fanout.";
    let missing: Vec<_> = declared(text)
        .into_iter()
        .filter(|m| !named(map, m))
        .collect();
    assert_eq!(missing, ["proto"]);
    assert!(!named("//! clients", "client"));
}
