//! The emulator console (telnet on the console port, 5554 by default): authentication and
//! snapshot save/load.
//!
//! Protocol: on connect the console prints a greeting ending in `OK`; when it says
//! `Authentication required`, the client sends `auth <token>` with the token from
//! `~/.emulator_console_auth_token`. Every command's reply is zero or more text lines ended by
//! a line `OK`, or by a line `KO: <message>`. Lines end in `\r\n`.

use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::net::TcpStream;

/// Where an emulator's console listens and how to authenticate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsoleAddress {
    /// Host (the emulator runs on this node: `127.0.0.1`).
    pub host: String,
    /// Console port (even, 5554–5682).
    pub port: u16,
    /// The auth-token file (`~/.emulator_console_auth_token`).
    pub token_file: PathBuf,
}

impl ConsoleAddress {
    /// The local console on `port`, with the token file in `$HOME`.
    pub fn local(port: u16) -> ConsoleAddress {
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_default();
        ConsoleAddress {
            host: "127.0.0.1".into(),
            port,
            token_file: home.join(".emulator_console_auth_token"),
        }
    }
}

/// Console failures.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConsoleError {
    /// Connecting, reading or writing failed, or the console went silent.
    #[error("emulator console {0}")]
    Io(String),
    /// The console answered `KO: message`.
    #[error("emulator console refused `{command}`: {message}")]
    Ko {
        /// The command sent.
        command: String,
        /// The console's message.
        message: String,
    },
    /// The auth token could not be read.
    #[error(
        "cannot read the emulator console token {path}: {reason} (start the emulator once as this user, or write the token there)"
    )]
    Token {
        /// The token file.
        path: String,
        /// Why.
        reason: String,
    },
}

/// A complete reply: `Ok(text before OK)` or `Err(KO message)`.
pub type Reply = Result<String, String>;

/// Parses one reply from the start of `buf`: `None` while incomplete, else the reply and how
/// many bytes it used.
pub fn parse_reply(buf: &str) -> Option<(Reply, usize)> {
    let mut used = 0;
    let mut body = Vec::new();
    for line in buf.split_inclusive('\n') {
        if !line.ends_with('\n') {
            return None;
        }
        used += line.len();
        let l = line.trim_end_matches(['\r', '\n']);
        if l == "OK" {
            return Some((Ok(body.join("\n")), used));
        }
        if let Some(msg) = l.strip_prefix("KO") {
            let msg = msg.trim_start_matches(':').trim();
            return Some((Err(msg.to_string()), used));
        }
        body.push(l);
    }
    None
}

/// Reads the console auth token (an empty file means no authentication).
pub fn read_token(path: &Path) -> Result<String, ConsoleError> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(|e| ConsoleError::Token {
            path: path.display().to_string(),
            reason: e.to_string(),
        })
}

/// A connected, authenticated console session.
#[derive(Debug)]
pub struct Console {
    stream: TcpStream,
    buf: String,
    timeout: Duration,
}

impl Console {
    /// Connects, reads the greeting and authenticates when the console asks for it.
    pub async fn connect(
        addr: &ConsoleAddress,
        timeout: Duration,
    ) -> Result<Console, ConsoleError> {
        let target = format!("{}:{}", addr.host, addr.port);
        let stream = tokio::time::timeout(timeout, TcpStream::connect(&target))
            .await
            .map_err(|_| ConsoleError::Io(format!("{target}: connect timed out")))?
            .map_err(|e| {
                ConsoleError::Io(format!(
                    "{target}: {e} (is the emulator running on this port?)"
                ))
            })?;
        let mut c = Console {
            stream,
            buf: String::new(),
            timeout,
        };
        let greeting = c
            .read_reply()
            .await?
            .map_err(|m| ConsoleError::Io(format!("greeting was KO: {m}")))?;
        if greeting.contains("Authentication required") {
            let token = read_token(&addr.token_file)?;
            c.command(&format!("auth {token}"))
                .await
                .map_err(|e| match e {
                    ConsoleError::Ko { message, .. } => ConsoleError::Ko {
                        command: "auth <token>".into(),
                        message,
                    },
                    other => other,
                })?;
        }
        Ok(c)
    }

    /// Sends one command; its reply text on `OK`.
    pub async fn command(&mut self, command: &str) -> Result<String, ConsoleError> {
        self.write_all(format!("{command}\r\n").as_bytes()).await?;
        self.read_reply()
            .await?
            .map_err(|message| ConsoleError::Ko {
                command: command.to_string(),
                message,
            })
    }

    /// `avd snapshot save <tag>`.
    pub async fn snapshot_save(&mut self, tag: &str) -> Result<(), ConsoleError> {
        self.command(&format!("avd snapshot save {}", check_tag(tag)?))
            .await
            .map(drop)
    }

    /// `avd snapshot load <tag>`.
    pub async fn snapshot_load(&mut self, tag: &str) -> Result<(), ConsoleError> {
        self.command(&format!("avd snapshot load {}", check_tag(tag)?))
            .await
            .map(drop)
    }

    async fn write_all(&mut self, mut data: &[u8]) -> Result<(), ConsoleError> {
        while !data.is_empty() {
            self.io(|s| async move { s.writable().await }).await?;
            match self.stream.try_write(data) {
                Ok(n) => data = &data[n..],
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(ConsoleError::Io(format!("write: {e}"))),
            }
        }
        Ok(())
    }

    async fn read_reply(&mut self) -> Result<Reply, ConsoleError> {
        loop {
            if let Some((reply, used)) = parse_reply(&self.buf) {
                self.buf.drain(..used);
                return Ok(reply);
            }
            self.io(|s| async move { s.readable().await }).await?;
            let mut chunk = [0u8; 4096];
            match self.stream.try_read(&mut chunk) {
                Ok(0) => return Err(ConsoleError::Io("closed the connection mid-reply".into())),
                Ok(n) => self.buf.push_str(&String::from_utf8_lossy(&chunk[..n])),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(ConsoleError::Io(format!("read: {e}"))),
            }
        }
    }

    async fn io<'s, F, Fut>(&'s self, f: F) -> Result<(), ConsoleError>
    where
        F: FnOnce(&'s TcpStream) -> Fut,
        Fut: std::future::Future<Output = std::io::Result<()>>,
    {
        tokio::time::timeout(self.timeout, f(&self.stream))
            .await
            .map_err(|_| ConsoleError::Io(format!("silent for {:?}", self.timeout)))?
            .map_err(|e| ConsoleError::Io(e.to_string()))
    }
}

/// Snapshot tags go on a console line: only `[A-Za-z0-9._-]`.
fn check_tag(tag: &str) -> Result<&str, ConsoleError> {
    if !tag.is_empty()
        && tag
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
    {
        Ok(tag)
    } else {
        Err(ConsoleError::Ko {
            command: format!("avd snapshot {tag}"),
            message: "snapshot names may use only letters, digits, '.', '_' and '-'".into(),
        })
    }
}

/// A fake console for tests: speaks the recorded protocol on a local port.
#[cfg(test)]
pub(crate) mod fake {
    use std::sync::{Arc, Mutex};
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    use tokio::net::TcpListener;

    /// Starts a fake console expecting `token`; returns its port and the commands it saw.
    pub async fn serve(token: &'static str) -> (u16, Arc<Mutex<Vec<String>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        // Snapshots outlive connections, as in a real emulator.
        let snapshots: Arc<Mutex<Vec<String>>> = Arc::default();
        tokio::spawn(async move {
            loop {
                let Ok((sock, _)) = listener.accept().await else {
                    return;
                };
                let log = log.clone();
                let snapshots = snapshots.clone();
                tokio::spawn(async move {
                    let (r, mut w) = sock.into_split();
                    let greeting =
                        crate::adb::fixture("console_greeting.txt").replace('\n', "\r\n");
                    w.write_all(greeting.as_bytes()).await.unwrap();
                    let mut lines = BufReader::new(r).lines();
                    let mut authed = false;
                    while let Ok(Some(line)) = lines.next_line().await {
                        let line = line.trim_end().to_string();
                        log.lock().unwrap().push(line.clone());
                        let reply = if let Some(t) = line.strip_prefix("auth ") {
                            if t == token {
                                authed = true;
                                "Android Console: type 'help' for a list of commands\r\nOK\r\n"
                                    .to_string()
                            } else {
                                "KO: authentication token does not match ~/.emulator_console_auth_token\r\n".to_string()
                            }
                        } else if !authed {
                            "KO: unknown command, try 'help'\r\n".to_string()
                        } else if let Some(tag) = line.strip_prefix("avd snapshot save ") {
                            snapshots.lock().unwrap().push(tag.to_string());
                            "OK\r\n".to_string()
                        } else if let Some(tag) = line.strip_prefix("avd snapshot load ") {
                            if snapshots.lock().unwrap().iter().any(|s| s == tag) {
                                "OK\r\n".to_string()
                            } else {
                                format!("KO: snapshot '{tag}' does not exist\r\n")
                            }
                        } else {
                            "KO: unknown command, try 'help'\r\n".to_string()
                        };
                        w.write_all(reply.as_bytes()).await.unwrap();
                    }
                });
            }
        });
        (port, seen)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_replies() {
        assert_eq!(parse_reply("OK\r\n"), Some((Ok(String::new()), 4)));
        assert_eq!(parse_reply("partial\r\nO"), None);
        assert_eq!(
            parse_reply("a\r\nb\r\nOK\r\nrest"),
            Some((Ok("a\nb".into()), 10))
        );
        assert_eq!(
            parse_reply("KO: snapshot 'x' does not exist\r\n"),
            Some((Err("snapshot 'x' does not exist".into()), 33))
        );
        let g = crate::adb::fixture("console_greeting.txt");
        let (r, _) = parse_reply(&g).unwrap();
        assert!(r.unwrap().contains("Authentication required"));
    }

    fn addr(port: u16, token: &str) -> (ConsoleAddress, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let token_file = dir.path().join(".emulator_console_auth_token");
        std::fs::write(&token_file, format!("{token}\n")).unwrap();
        (
            ConsoleAddress {
                host: "127.0.0.1".into(),
                port,
                token_file,
            },
            dir,
        )
    }

    #[tokio::test]
    async fn authenticates_and_snapshots() {
        let (port, seen) = fake::serve("s3cr3t").await;
        let (a, _dir) = addr(port, "s3cr3t");
        let mut c = Console::connect(&a, Duration::from_secs(5)).await.unwrap();
        c.snapshot_save("bug-42").await.unwrap();
        c.snapshot_load("bug-42").await.unwrap();
        let e = c.snapshot_load("missing").await.unwrap_err();
        assert_eq!(
            e,
            ConsoleError::Ko {
                command: "avd snapshot load missing".into(),
                message: "snapshot 'missing' does not exist".into()
            }
        );
        assert!(c.snapshot_save("a b; kill").await.is_err());
        assert_eq!(
            *seen.lock().unwrap(),
            [
                "auth s3cr3t",
                "avd snapshot save bug-42",
                "avd snapshot load bug-42",
                "avd snapshot load missing"
            ]
        );
    }

    #[tokio::test]
    async fn bad_token_and_missing_file_are_clear() {
        let (port, _) = fake::serve("right").await;
        let (a, _dir) = addr(port, "wrong");
        let e = Console::connect(&a, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(matches!(&e, ConsoleError::Ko { command, .. } if command == "auth <token>"));
        assert!(!e.to_string().contains("wrong"), "token leaked: {e}");
        let mut a = a;
        a.token_file = "/nonexistent/.emulator_console_auth_token".into();
        let e = Console::connect(&a, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(matches!(e, ConsoleError::Token { .. }));
        assert!(e.to_string().contains("start the emulator once"));
    }

    #[tokio::test]
    async fn refused_connection_is_io() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        drop(l);
        let (a, _dir) = addr(port, "x");
        let e = Console::connect(&a, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("is the emulator running"));
    }
}
