//! TLS for the test servers ([`crate::testing`], [`crate::testing::sentinel`]):
//! a server certificate and key, the authority both sides trust, and
//! optionally a client certificate the servers then require.

/// A server certificate and its key (PEM files) for TLS-only servers.
#[derive(Debug, Clone)]
pub struct Tls {
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
    /// The authority clients and the other servers trust; `None`: `cert`
    /// itself (a self-signed test certificate naming 127.0.0.1).
    pub ca: Option<std::path::PathBuf>,
    /// A client certificate and its key: the servers then require one
    /// signed by `ca` of every client (`tls-auth-clients yes`,
    /// `nats-server --tlsverify`), and the helpers' own connections
    /// present this one. `None`: client certificates optional.
    pub client: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

impl Tls {
    /// The authority's file.
    pub fn ca(&self) -> &std::path::Path {
        self.ca.as_deref().unwrap_or(&self.cert)
    }

    /// `redis-server` arguments: TLS on `port`, no plain port, the bus and
    /// replication over TLS; client certificates optional unless
    /// [`Tls::client`] is set (the servers present `cert` to each other).
    pub fn server_args(&self, port: u16) -> Vec<String> {
        let mut a: Vec<String> = ["--port", "0", "--tls-port"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        a.push(port.to_string());
        for (k, v) in [
            ("--tls-cert-file", self.cert.as_path()),
            ("--tls-key-file", self.key.as_path()),
            ("--tls-ca-cert-file", self.ca()),
        ] {
            a.push(k.into());
            a.push(v.display().to_string());
        }
        for s in [
            "--tls-auth-clients",
            self.auth_clients(),
            "--tls-cluster",
            "yes",
            "--tls-replication",
            "yes",
        ] {
            a.push(s.into());
        }
        a
    }

    /// `tls-auth-clients`' value.
    pub fn auth_clients(&self) -> &'static str {
        if self.client.is_some() {
            "yes"
        } else {
            "optional"
        }
    }

    /// `redis-cli` arguments to reach such a server.
    pub fn cli_args(&self) -> Vec<String> {
        let mut a = vec![
            "--tls".into(),
            "--cacert".into(),
            self.ca().display().to_string(),
        ];
        if let Some((cert, key)) = &self.client {
            a.push("--cert".into());
            a.push(cert.display().to_string());
            a.push("--key".into());
            a.push(key.display().to_string());
        }
        a
    }

    /// The redis crate's certificates for the helpers' own connections.
    pub fn redis_certs(&self) -> std::io::Result<redis::TlsCertificates> {
        Ok(redis::TlsCertificates {
            client_tls: match &self.client {
                Some((cert, key)) => Some(redis::ClientTlsConfig {
                    client_cert: std::fs::read(cert)?,
                    client_key: std::fs::read(key)?,
                }),
                None => None,
            },
            root_cert: Some(std::fs::read(self.ca())?),
        })
    }
}
