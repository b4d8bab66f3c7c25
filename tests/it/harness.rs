//! The test harness's own promise: a `herald` a test starts never outlives
//! it. `common::herald_command` asks the kernel to kill the child when the
//! thread that started it ends, which covers what a drop guard cannot (an
//! abort, a harness timeout, a killed test process).

use crate::common;

use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

#[test]
fn a_herald_dies_with_the_thread_that_started_it() {
    let dir = std::env::temp_dir().join(format!("herald-harness-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let port = common::free_port();
    let starter_dir = dir.clone();
    // Started from a thread that then ends, without killing it (the guard
    // is forgotten, as a leaked one would be).
    let pid = std::thread::spawn(move || {
        let args = ["--host", "127.0.0.1", "--port", &port.to_string()];
        let spawned = common::Spawned::serve(&starter_dir, &args, &[("HERALD_LOG", "warn")]);
        let deadline = Instant::now() + common::TIMEOUT;
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "herald did not listen on {port}:\n{}",
                spawned.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let pid = spawned.child.id() as libc::pid_t;
        std::mem::forget(spawned);
        pid
    })
    .join()
    .expect("starter thread");

    // The starter thread is gone: the kernel sends herald SIGKILL. Reap it.
    let deadline = Instant::now() + common::TIMEOUT;
    let status = loop {
        let mut status = 0;
        // SAFETY: waitpid on our own child, with a valid out-pointer.
        let rc = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        assert!(rc >= 0, "waitpid: {}", std::io::Error::last_os_error());
        if rc == pid {
            break std::process::ExitStatus::from_raw(status);
        }
        if Instant::now() >= deadline {
            // SAFETY: kill(2) on our own, unreaped child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("herald (pid {pid}) outlived the thread that started it");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
