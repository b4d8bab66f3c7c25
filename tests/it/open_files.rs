//! `herald serve` raises its open-file soft limit to the hard limit, so a
//! host that starts processes with a soft limit of 1024 does not cap the
//! server at about a thousand clients.

use crate::common;

use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::time::{Duration, Instant};

fn soft_nofile(pid: u32) -> Option<u64> {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// Say that this test checked nothing, where it is seen: the harness
/// captures `eprintln!` and shows it only when a test fails, so a skip
/// printed that way would pass as a silent success. Writing to the stderr
/// handle itself is not captured.
fn skipped(why: &str) {
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED open_files::serve_raises_its_soft_open_file_limit: {why}"
    );
}

#[test]
fn serve_raises_its_soft_open_file_limit() {
    let mut hard = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes only the struct we pass.
    assert_eq!(
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut hard) },
        0
    );
    if hard.rlim_max <= 256 {
        skipped(&format!(
            "the open-file hard limit here is {}, too low to tell a raise above \
             the soft limit of 256 this test starts herald with; nothing was checked",
            hard.rlim_max
        ));
        return;
    }
    let port = common::free_port();
    let mut cmd = common::herald_command();
    cmd.args([
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        &port.to_string(),
        "--log",
        "warn",
    ])
    .env_remove("HERALD_CONFIG")
    .stdin(Stdio::null())
    .stderr(Stdio::null());
    // SAFETY: setrlimit is async-signal-safe; the closure touches nothing else.
    unsafe {
        cmd.pre_exec(|| {
            let mut lim = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
            lim.rlim_cur = 256;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut seen = None;
    while Instant::now() < deadline {
        // The limit is raised before the server listens; wait for /up.
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            seen = soft_nofile(child.id());
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    let _ = child.wait();
    assert_eq!(seen, Some(hard.rlim_max));
}
