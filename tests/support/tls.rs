//! TLS test material made at test start with the `openssl` command: a throwaway CA, a server
//! certificate it signs for 127.0.0.1, and a `redis-server` serving TLS on a second port.
//! Used by `tests/tls.rs` through `#[path]`.
#![allow(unreachable_pub)]

use std::{
    net::TcpListener,
    path::{Path, PathBuf},
    process::Command,
    sync::atomic::{AtomicU64, Ordering},
};

use crate::support::RedisServer;

static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// A CA and a server certificate in a temp dir, removed on drop.
#[derive(Debug)]
pub struct TlsFiles {
    dir: PathBuf,
}

impl TlsFiles {
    /// Makes a CA (`ca.crt`) and a server certificate for 127.0.0.1 it signs (`server.crt`,
    /// `server.key`).
    ///
    /// # Panics
    /// When `openssl` is missing or fails: the TLS tests need it (`scripts/test.sh` installs
    /// it).
    pub fn generate() -> Self {
        let dir = std::env::temp_dir().join(format!(
            "tower-lock-tls-{}-{}",
            std::process::id(),
            NEXT_ID.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the TLS dir");
        let files = Self { dir };
        files.make_ca("ca");
        std::fs::write(
            files.path("server.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n\
             basicConstraints=CA:FALSE\n",
        )
        .expect("write server.ext");
        files.openssl(&[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        ]);
        files.openssl(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-extfile",
            "server.ext",
        ]);
        files
    }

    /// Makes another, unrelated CA named `name` (`name.crt`), and returns its certificate.
    pub fn make_ca(&self, name: &str) -> Vec<u8> {
        let (key, cert) = (format!("{name}.key"), format!("{name}.crt"));
        self.openssl(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &cert,
            "-days",
            "2",
            "-subj",
            "/CN=tower-lock test CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]);
        self.read(&cert)
    }

    /// The contents of `name` in the dir.
    pub fn read(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.path(name)).unwrap_or_else(|e| panic!("read {name}: {e}"))
    }

    /// The path of `name` in the dir.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn openssl(&self, args: &[&str]) {
        let output =
            Command::new("openssl").args(args).current_dir(&self.dir).output().unwrap_or_else(
                |e| panic!("cannot run openssl (Debian/Ubuntu: apt-get install openssl): {e}"),
            );
        assert!(
            output.status.success(),
            "openssl {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

impl Drop for TlsFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A server with plain text on its fixture port (for the fixture's own commands) and TLS on
/// the returned port, with `files`' certificate. Client certificates are not asked for.
pub fn start_tls_server(files: &TlsFiles) -> (RedisServer, u16) {
    start_tls_server_with(files, "no")
}

/// As [`start_tls_server`], with `--tls-auth-clients` set to `auth_clients` (`yes` requires a
/// client certificate signed by the CA).
pub fn start_tls_server_with(files: &TlsFiles, auth_clients: &str) -> (RedisServer, u16) {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port();
    let path = |name: &str| path_arg(&files.path(name));
    let server = RedisServer::start_with(&[
        "--tls-port",
        &port.to_string(),
        "--tls-cert-file",
        &path("server.crt"),
        "--tls-key-file",
        &path("server.key"),
        "--tls-ca-cert-file",
        &path("ca.crt"),
        "--tls-auth-clients",
        auth_clients,
    ]);
    (server, port)
}

fn path_arg(path: &Path) -> String {
    path.to_str().expect("a UTF-8 temp path").to_owned()
}
