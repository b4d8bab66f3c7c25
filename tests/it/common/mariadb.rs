//! A real MariaDB server for a test: Debian's `mariadb-server` package
//! (scripts/test installs it), a fresh data directory in a scratch
//! directory, on a free loopback port, killed with the test. Grants are
//! skipped (any user and password connect): a fixture, not a deployment.
//! As root the server runs as the package's `mysql` user.

use super::{die_with_parent, free_port, TIMEOUT};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Instant;

pub struct MariaDb {
    child: Child,
    pub port: u16,
    dir: PathBuf,
}

/// The `mysql` user's ids when running as root.
fn run_as() -> Option<(u32, u32)> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let name = std::ffi::CString::new("mysql").unwrap();
    // SAFETY: a valid C string; the result is read at once.
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    assert!(
        !pw.is_null(),
        "running as root and there is no `mysql` user"
    );
    // SAFETY: non-null, from getpwnam.
    Some(unsafe { ((*pw).pw_uid, (*pw).pw_gid) })
}

fn command(program: &str) -> Command {
    let mut cmd = Command::new(program);
    if let Some((uid, gid)) = run_as() {
        cmd.uid(uid).gid(gid);
    }
    die_with_parent(&mut cmd);
    cmd
}

impl MariaDb {
    /// A new server with an empty database `main`, ready.
    pub async fn start() -> MariaDb {
        assert!(
            std::path::Path::new("/usr/sbin/mariadbd").exists(),
            "MariaDB is not installed: apt-get install mariadb-server"
        );
        let dir = std::env::temp_dir().join(format!(
            "herald-maria-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        if let Some((uid, gid)) = run_as() {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).unwrap();
        }
        let data = dir.join("data");
        let out = command("mariadb-install-db")
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .args(["--skip-test-db", "--auth-root-authentication-method=normal"])
            .stdout(Stdio::null())
            .output()
            .expect("mariadb-install-db");
        assert!(
            out.status.success(),
            "mariadb-install-db: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let port = free_port();
        let child = command("/usr/sbin/mariadbd")
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--socket={}", dir.join("sock").display()))
            .arg(format!("--pid-file={}", dir.join("pid").display()))
            .arg(format!("--port={port}"))
            .args(["--bind-address=127.0.0.1", "--skip-grant-tables"])
            .args(["--skip-log-bin", "--innodb-buffer-pool-size=16M"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("mariadb.log")).unwrap())
            .spawn()
            .expect("spawn mariadbd");
        let db = MariaDb { child, port, dir };
        let deadline = Instant::now() + TIMEOUT * 3;
        loop {
            match db
                .exec_on("mysql", "CREATE DATABASE IF NOT EXISTS main")
                .await
            {
                Ok(()) => break,
                Err(e) => assert!(
                    Instant::now() < deadline,
                    "mariadb did not start ({e}): {}",
                    std::fs::read_to_string(db.dir.join("mariadb.log")).unwrap_or_default()
                ),
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        db
    }

    /// The URL of database `main`.
    pub fn url(&self) -> String {
        format!("mysql://root:password@127.0.0.1:{}/main", self.port)
    }

    async fn exec_on(&self, database: &str, sql: &str) -> Result<(), String> {
        use mysql_async::prelude::Queryable;
        let url = format!("mysql://root:password@127.0.0.1:{}/{database}", self.port);
        let opts = mysql_async::Opts::from_url(&url).map_err(|e| e.to_string())?;
        let mut conn = mysql_async::Conn::new(opts)
            .await
            .map_err(|e| e.to_string())?;
        conn.query_drop(sql).await.map_err(|e| e.to_string())?;
        conn.disconnect().await.map_err(|e| e.to_string())
    }

    /// Run a statement in `main`, panicking on an error.
    pub async fn exec(&self, sql: &str) {
        self.exec_on("main", sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// Stop the server (the database goes away).
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for MariaDb {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
