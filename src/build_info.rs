//! What this binary is: its version, the commit it was built from and that
//! commit's date (set by `build.rs`), shown by `herald --version`, served on
//! `/version` and exported as the `herald_build_info` metric, so an operator
//! can tell which build answers on a node without shell access.

/// The crate's version, e.g. `0.1.0`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The short commit hash (`-dirty` with uncommitted changes), or `unknown`
/// when built outside a git checkout without `HERALD_COMMIT`.
pub const COMMIT: &str = env!("HERALD_BUILD_COMMIT");
/// The commit's date (YYYY-MM-DD), or `unknown`.
pub const COMMIT_DATE: &str = env!("HERALD_BUILD_COMMIT_DATE");
/// The target triple the binary was compiled for.
pub const TARGET: &str = env!("HERALD_BUILD_TARGET");
/// `debug` or `release`.
pub const PROFILE: &str = env!("HERALD_BUILD_PROFILE");

/// `herald --version`'s text after the name: `0.1.0 (commit abc, 2025-01-01)`.
pub const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("HERALD_BUILD_COMMIT"),
    ", ",
    env!("HERALD_BUILD_COMMIT_DATE"),
    ", ",
    env!("HERALD_BUILD_TARGET"),
    ", ",
    env!("HERALD_BUILD_PROFILE"),
    ")"
);

/// The `/version` body.
pub fn json() -> serde_json::Value {
    serde_json::json!({
        "name": "herald",
        "version": VERSION,
        "commit": COMMIT,
        "commit_date": COMMIT_DATE,
        "target": TARGET,
        "profile": PROFILE,
    })
}

/// The `herald_build_info` gauge in Prometheus text format: always 1, the
/// facts in its labels (the usual `*_build_info` convention, so dashboards
/// can join on `version`/`commit`).
pub fn metric() -> String {
    format!(
        "# HELP herald_build_info The running build: version and commit in the labels, always 1\n\
         # TYPE herald_build_info gauge\n\
         herald_build_info{{version=\"{}\",commit=\"{}\",commit_date=\"{}\",target=\"{}\",profile=\"{}\"}} 1\n",
        VERSION, COMMIT, COMMIT_DATE, TARGET, PROFILE
    )
}
