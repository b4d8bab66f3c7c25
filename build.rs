//! Build facts for `herald --version`, `/version` and `herald_build_info`:
//! the commit and its date, read from git when the source is a checkout.
//!
//! Nothing is downloaded and nothing fails the build: an image build context
//! or a source tarball has no `.git`, so the commit comes from
//! `HERALD_COMMIT` (the image build passes it) or is `unknown`.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn main() {
    println!("cargo:rerun-if-env-changed=HERALD_COMMIT");
    println!("cargo:rerun-if-env-changed=HERALD_COMMIT_DATE");
    // Rebuild when HEAD moves: HEAD itself (branch switches) and the
    // worktree's reflog (every commit appends to it). Paths come from git,
    // so linked worktrees (where `.git` is a file) work too.
    for path in ["HEAD", "logs/HEAD"] {
        if let Some(p) = git(&["rev-parse", "--git-path", path]) {
            if std::path::Path::new(&p).exists() {
                println!("cargo:rerun-if-changed={p}");
            }
        }
    }
    let from_env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    let commit = from_env("HERALD_COMMIT")
        .or_else(|| {
            let hash = git(&["rev-parse", "--short=12", "HEAD"])?;
            // Uncommitted changes to tracked files: the commit alone does
            // not describe this binary.
            let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).is_some();
            Some(if dirty { format!("{hash}-dirty") } else { hash })
        })
        .unwrap_or_else(|| "unknown".into());
    let date = from_env("HERALD_COMMIT_DATE")
        .or_else(|| git(&["log", "-1", "--format=%cs"]))
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=HERALD_BUILD_COMMIT={commit}");
    println!("cargo:rustc-env=HERALD_BUILD_COMMIT_DATE={date}");
    println!(
        "cargo:rustc-env=HERALD_BUILD_TARGET={}",
        std::env::var("TARGET").unwrap_or_default()
    );
    println!(
        "cargo:rustc-env=HERALD_BUILD_PROFILE={}",
        std::env::var("PROFILE").unwrap_or_default()
    );
}
