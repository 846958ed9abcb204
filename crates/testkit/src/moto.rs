//! moto's server (`moto_server`, `moto[server]==5.2.5`; `scripts/test.sh` installs it): the
//! tests' DynamoDB, S3, Glue and S3 Tables, one process per test.

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::free_port;

/// A moto server on loopback, killed when dropped.
pub struct Moto {
    /// `http://127.0.0.1:<port>`.
    pub endpoint: String,
    child: Child,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Moto {
    /// Starts a fresh server. The port is free when chosen, but another test's server may take
    /// it before moto binds it (moto then exits): a server that is not this moto is retried on
    /// another port.
    ///
    /// # Panics
    /// When `moto_server` does not run, or listens on none of 3 ports within 60 s each.
    pub fn start() -> Moto {
        (0..3)
            .find_map(|_| {
                let port = free_port();
                let child = Command::new("moto_server")
                    .args(["-H", "127.0.0.1", "-p", &port.to_string()])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect(
                        "moto_server runs: install it with `pip install 'moto[server]==5.2.5'` \
                         (scripts/test.sh does)",
                    );
                let mut moto = Moto {
                    endpoint: format!("http://127.0.0.1:{port}"),
                    child,
                };
                moto.answers(port).then_some(moto)
            })
            .expect("moto_server listened on none of 3 free ports within 60 s each")
    }

    /// Whether this moto answers on `port` (its own `/moto-api/`, not another test's server
    /// that took the port first), waiting up to 60 s; `false` once it exited.
    fn answers(&mut self, port: u16) -> bool {
        use std::io::{Read as _, Write as _};
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if self.child.try_wait().ok().flatten().is_some() {
                return false;
            }
            if let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) {
                let mut answer = String::new();
                let asked = stream
                    .write_all(b"GET /moto-api/data.json HTTP/1.0\r\nHost: moto\r\n\r\n")
                    .and_then(|()| stream.read_to_string(&mut answer));
                if asked.is_ok() && answer.split_whitespace().nth(1) == Some("200") {
                    return self.child.try_wait().ok().flatten().is_none();
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }
}
