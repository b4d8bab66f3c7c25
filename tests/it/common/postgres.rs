//! A real PostgreSQL server for a test: Debian's `postgresql` package
//! (`apt-get install postgresql`; scripts/test installs it), a fresh
//! cluster in a scratch directory, listening on a free loopback port,
//! killed with the test. PostgreSQL refuses to run as root: as root the
//! server runs as the package's `postgres` user.

use super::{die_with_parent, free_port, TIMEOUT};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Instant;

pub struct Postgres {
    child: Child,
    pub port: u16,
    dir: PathBuf,
}

/// Where the package's programs are (`/usr/lib/postgresql/15/bin`).
fn bindir() -> PathBuf {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.path().join("bin"))
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found
        .pop()
        .filter(|p| p.join("initdb").exists())
        .expect("PostgreSQL is not installed: apt-get install postgresql")
}

/// The `postgres` user's ids when running as root (PostgreSQL will not).
fn run_as() -> Option<(u32, u32)> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let name = std::ffi::CString::new("postgres").unwrap();
    // SAFETY: a valid C string; the result is read at once.
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    assert!(
        !pw.is_null(),
        "running as root and there is no `postgres` user"
    );
    // SAFETY: non-null, from getpwnam.
    Some(unsafe { ((*pw).pw_uid, (*pw).pw_gid) })
}

fn command(program: PathBuf) -> Command {
    let mut cmd = Command::new(program);
    if let Some((uid, gid)) = run_as() {
        cmd.uid(uid).gid(gid);
    }
    die_with_parent(&mut cmd);
    cmd
}

impl Postgres {
    /// A new cluster whose superuser is `herald` (trust on loopback), ready.
    pub async fn start() -> Postgres {
        let bin = bindir();
        let dir =
            std::env::temp_dir().join(format!("herald-pg-{}-{}", std::process::id(), free_port()));
        std::fs::create_dir_all(&dir).unwrap();
        if let Some((uid, gid)) = run_as() {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).unwrap();
        }
        let data = dir.join("data");
        let out = command(bin.join("initdb"))
            .args(["-A", "trust", "-U", "herald", "--no-sync", "-D"])
            .arg(&data)
            .stdout(Stdio::null())
            .output()
            .expect("initdb");
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let port = free_port();
        let child = command(bin.join("postgres"))
            .arg("-D")
            .arg(&data)
            .args(["-p", &port.to_string(), "-c", "listen_addresses=127.0.0.1"])
            .args(["-c", "fsync=off", "-c", "max_connections=50", "-k"])
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("postgres.log")).unwrap())
            .spawn()
            .expect("spawn postgres");
        let pg = Postgres { child, port, dir };
        let deadline = Instant::now() + TIMEOUT;
        while pg.client().await.is_err() {
            assert!(
                Instant::now() < deadline,
                "postgres did not start: {}",
                std::fs::read_to_string(pg.dir.join("postgres.log")).unwrap_or_default()
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        pg
    }

    pub fn url(&self) -> String {
        format!("postgres://herald@127.0.0.1:{}/postgres", self.port)
    }

    /// A connected client (its connection driven on this runtime).
    pub async fn client(&self) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
        let (client, conn) = tokio_postgres::connect(&self.url(), tokio_postgres::NoTls).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(client)
    }

    /// Run SQL statements, panicking on an error.
    pub async fn exec(&self, sql: &str) {
        let c = self.client().await.expect("connect to postgres");
        c.batch_execute(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// Stop the server (the database goes away), keeping its data.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
