//! Credentials per role: who may do what at the coordinator.
//!
//! Three roles: `node` (Register and Work, as the node names the credential binds), `client`
//! (submit, watch, list, read results, cancel its own runs) and `admin` (all of that, for any run,
//! and nodes under any name). A credential is a random token; the coordinator keeps only its
//! SHA-256 (`DATA/credentials.json`, mode 0600), finds a presented token by that hash and compares
//! in constant time. Tokens made here say their role in their prefix (`rb-node-…`), so an error
//! can say which kind was presented. A data directory from before credentials has one join token
//! (`DATA/token`): it becomes an admin credential the first time the coordinator starts.
//!
//! The file is re-read when it changes, so `reprobench credential add|revoke` on the
//! coordinator's machine takes effect at once, and a revoked node's open stream is closed.

use reprobench_domain::secret::{random_hex, same_secret};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// File in the data directory holding the credentials' hashes.
pub const CREDENTIALS_FILE: &str = "credentials.json";

/// What a credential lets its holder do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Everything: runs of anyone, nodes under any name, cancelling any run.
    Admin,
    /// Submit, watch, list, read results, cancel the runs it submitted.
    Client,
    /// Register and work as the node names the credential binds.
    Node,
}

impl Role {
    /// The role's name, as in the file and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Client => "client",
            Role::Node => "node",
        }
    }

    /// Reads `admin`, `client` or `node`.
    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "admin" => Some(Role::Admin),
            "client" => Some(Role::Client),
            "node" => Some(Role::Node),
            _ => None,
        }
    }
}

/// One credential as stored: its hash, never the token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Credential {
    /// Short id for listing and revoking (the hash's first 12 hex digits).
    pub id: String,
    /// What it may do.
    pub role: Role,
    /// A node credential acts only as this node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// A node credential (per pool) acts only as nodes whose names start with this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_prefix: Option<String>,
    /// Who or what holds it, in words.
    #[serde(default)]
    pub label: String,
    /// SHA-256 of the token, hex.
    pub hash: String,
    /// Refused from now on.
    #[serde(default)]
    pub revoked: bool,
    /// When it was made (ms since the epoch).
    #[serde(default)]
    pub created_ms: i64,
}

/// The credentials file.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct CredentialsFile {
    version: u32,
    credentials: Vec<Credential>,
}

/// Who a call comes from, once its credential is known.
#[derive(Debug, Clone, PartialEq)]
pub struct Principal {
    /// The credential's id.
    pub id: String,
    /// Its role.
    pub role: Role,
    /// The node it binds (node credentials).
    pub node: Option<String>,
    /// The node-name prefix it binds (pool credentials).
    pub node_prefix: Option<String>,
}

impl Principal {
    fn of(c: &Credential) -> Principal {
        Principal {
            id: c.id.clone(),
            role: c.role,
            node: c.node.clone(),
            node_prefix: c.node_prefix.clone(),
        }
    }

    /// Why this caller may not act as node `node_id` (Register, Work); `None` when it may.
    pub fn node_refusal(&self, node_id: &str) -> Option<String> {
        match self.role {
            Role::Admin => None,
            Role::Client => Some(format!(
                "credential {} is a client credential, which may submit and watch runs but not act as a node: start the node with a node credential (`reprobench credential add --role node --node {node_id}` on the coordinator's machine; in the Helm chart each pool's nodes get theirs from the pool's Secret)",
                self.id
            )),
            Role::Node => match (&self.node, &self.node_prefix) {
                (Some(name), _) if name != node_id => Some(format!(
                    "credential {} is bound to node `{name}`, not `{node_id}`: start the node with --name {name}, or give it a credential of its own",
                    self.id
                )),
                (None, Some(prefix)) if !node_id.starts_with(prefix.as_str()) => Some(format!(
                    "credential {} is bound to the nodes named `{prefix}…`, not `{node_id}`: use the credential of this node's pool",
                    self.id
                )),
                _ => None,
            },
        }
    }

    /// Why this caller may not use the run API (submit, watch, list, results); `None` when it may.
    pub fn client_refusal(&self) -> Option<String> {
        (self.role == Role::Node).then(|| format!(
            "credential {} is a node credential, which may only register and work as a node: submit and watch runs with a client credential (`reprobench credential add --role client` on the coordinator's machine, or its DATA/token as admin)",
            self.id
        ))
    }

    /// Why this caller may not cancel a run submitted under credential `owner`.
    pub fn cancel_refusal(&self, owner: &str) -> Option<String> {
        if let Some(refusal) = self.client_refusal() {
            return Some(refusal);
        }
        (self.role != Role::Admin && self.id != owner).then(|| format!(
            "credential {} did not submit this run, and only its submitter or an admin credential (the coordinator's DATA/token) may cancel it",
            self.id
        ))
    }
}

/// Why a presented token was refused.
#[derive(Debug, Clone, PartialEq)]
pub enum AuthError {
    /// No `authorization: Bearer …` at all.
    Missing,
    /// No credential has this token's hash.
    Unknown,
    /// The credential was revoked.
    Revoked(String),
}

/// SHA-256 of a token, hex.
pub fn token_hash(token: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// A fresh token for `role` (`rb-ROLE-` and 64 random hex digits).
pub fn new_token(role: Role) -> String {
    format!("rb-{}-{}", role.as_str(), random_hex(32))
}

/// The credential a token stands for (not yet stored).
pub fn credential_for(
    token: &str,
    role: Role,
    node: Option<String>,
    node_prefix: Option<String>,
    label: &str,
    now_ms: i64,
) -> Credential {
    let hash = token_hash(token);
    Credential {
        id: hash[..12].to_string(),
        role,
        node,
        node_prefix,
        label: label.to_string(),
        hash,
        revoked: false,
        created_ms: now_ms,
    }
}

/// Problems with the credentials file.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    /// Reading or writing failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file is not a credentials file.
    #[error(
        "{path} is not a reprobench credentials file ({message}): restore it from a backup, or move it away to start over (every node and client then needs a new credential)"
    )]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// No credential has this id.
    #[error("no credential `{0}`; `reprobench credential list --data DIR` lists them")]
    NoSuchId(String),
    /// The request makes no sense.
    #[error("{0}")]
    Invalid(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CredentialsError + '_ {
    move |source| CredentialsError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn read_file(path: &Path) -> Result<Option<CredentialsFile>, CredentialsError> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| CredentialsError::Corrupt {
                path: path.to_path_buf(),
                message: e.to_string(),
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io(path)(e)),
    }
}

/// Writes the file whole (a temporary file renamed over it), readable by its owner only.
fn write_file(path: &Path, file: &CredentialsFile) -> Result<(), CredentialsError> {
    let tmp = path.with_extension("json.tmp");
    {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io(&tmp))?;
        let text = serde_json::to_string_pretty(file).expect("credentials serialize");
        std::io::Write::write_all(&mut f, format!("{text}\n").as_bytes()).map_err(io(&tmp))?;
        f.sync_all().map_err(io(&tmp))?;
    }
    std::fs::rename(&tmp, path).map_err(io(path))
}

/// Runs `change` on the data directory's credentials under an exclusive lock (the coordinator
/// may be reading them), and writes them back.
fn change_file<T>(
    data_dir: &Path,
    change: impl FnOnce(&mut CredentialsFile) -> Result<T, CredentialsError>,
) -> Result<T, CredentialsError> {
    use std::os::fd::AsRawFd;
    let lock_path = data_dir.join("credentials.lock");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&lock_path)
        .map_err(io(&lock_path))?;
    // SAFETY: flock on a descriptor we own; released when `lock` is dropped.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(io(&lock_path)(std::io::Error::last_os_error()));
    }
    let path = data_dir.join(CREDENTIALS_FILE);
    let mut file = read_file(&path)?.unwrap_or(CredentialsFile {
        version: 1,
        credentials: Vec::new(),
    });
    let out = change(&mut file)?;
    write_file(&path, &file)?;
    Ok(out)
}

/// Adds a credential for `role` to the data directory and returns it with its token (shown once;
/// only its hash is kept).
pub fn add(
    data_dir: &Path,
    role: Role,
    node: Option<String>,
    node_prefix: Option<String>,
    label: &str,
    now_ms: i64,
) -> Result<(Credential, String), CredentialsError> {
    if role != Role::Node && (node.is_some() || node_prefix.is_some()) {
        return Err(CredentialsError::Invalid(format!(
            "--node and --node-prefix bind node credentials; a {} credential binds no node",
            role.as_str()
        )));
    }
    if role == Role::Node && node.is_none() && node_prefix.is_none() {
        return Err(CredentialsError::Invalid(
            "a node credential acts as the nodes it binds: give --node NAME (one node) or --node-prefix PREFIX (a pool)".into(),
        ));
    }
    let token = new_token(role);
    let credential = credential_for(&token, role, node, node_prefix, label, now_ms);
    let stored = credential.clone();
    change_file(data_dir, move |file| {
        file.credentials.push(stored);
        Ok(())
    })?;
    Ok((credential, token))
}

/// Revokes credential `id` (or a unique prefix of it); returns it.
pub fn revoke(data_dir: &Path, id: &str) -> Result<Credential, CredentialsError> {
    change_file(data_dir, |file| {
        let mut matching = file
            .credentials
            .iter_mut()
            .filter(|c| !id.is_empty() && c.id.starts_with(id));
        match (matching.next(), matching.next()) {
            (Some(c), None) => {
                c.revoked = true;
                Ok(c.clone())
            }
            (Some(_), Some(_)) => Err(CredentialsError::Invalid(format!(
                "`{id}` is the start of several credentials' ids: give more of it"
            ))),
            (None, _) => Err(CredentialsError::NoSuchId(id.to_string())),
        }
    })
}

/// The data directory's credentials (hashes and bindings).
pub fn list(data_dir: &Path) -> Result<Vec<Credential>, CredentialsError> {
    Ok(read_file(&data_dir.join(CREDENTIALS_FILE))?
        .map(|f| f.credentials)
        .unwrap_or_default())
}

/// A credential given to `serve` in a file (`--credential ROLE[:PREFIX]=FILE`, a mounted Secret):
/// known while the coordinator runs, never written to the credentials file.
#[derive(Debug, Clone, PartialEq)]
pub struct FileCredential {
    /// Its role.
    pub role: Role,
    /// For a node credential, the node-name prefix it binds.
    pub node_prefix: Option<String>,
    /// The file holding the token.
    pub path: PathBuf,
}

impl std::str::FromStr for FileCredential {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (head, path) = s.split_once('=').ok_or_else(|| {
            format!("`{s}`: write ROLE=FILE or node:PREFIX=FILE (for example node:rb-node-docker-=/secrets/docker/token)")
        })?;
        let (role, prefix) = match head.split_once(':') {
            Some((role, prefix)) => (role, Some(prefix.to_string())),
            None => (head, None),
        };
        let role = Role::parse(role)
            .ok_or_else(|| format!("`{s}`: the role is admin, client or node, not `{role}`"))?;
        if (role == Role::Node) != prefix.is_some() {
            return Err(format!(
                "`{s}`: a node credential names the prefix of its nodes' names (node:PREFIX=FILE), and only a node credential does"
            ));
        }
        Ok(FileCredential {
            role,
            node_prefix: prefix,
            path: PathBuf::from(path),
        })
    }
}

/// How the credentials were opened, for what the coordinator says at start.
#[derive(Debug, Clone, PartialEq)]
pub enum Opening {
    /// The file was there.
    Existing,
    /// A new data directory: the admin credential was made (its token in the token file), or
    /// is the token file's.
    Created,
    /// A data directory from before credentials: its join token is now the admin credential.
    Upgraded,
}

/// The credentials a coordinator checks calls against.
#[derive(Debug)]
pub struct Credentials {
    path: PathBuf,
    by_hash: HashMap<String, Credential>,
    from_files: Vec<Credential>,
    seen: Option<SystemTime>,
}

impl Credentials {
    /// Opens the data directory's credentials. A missing file is made with one admin credential:
    /// the token in `token_file` when there is one (an upgrade), else a new token written there.
    /// `files` are read and known besides.
    pub fn open(
        data_dir: &Path,
        token_file: &Path,
        files: &[FileCredential],
        now_ms: i64,
    ) -> Result<(Credentials, Opening), CredentialsError> {
        let path = data_dir.join(CREDENTIALS_FILE);
        let mut opening = Opening::Existing;
        if read_file(&path)?.is_none() {
            let existing = match std::fs::read_to_string(token_file) {
                Ok(text) if !text.trim().is_empty() => Some(text.trim().to_string()),
                Ok(_) => None,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(io(token_file)(e)),
            };
            let (token, label) = match existing {
                Some(token) => {
                    opening = Opening::Upgraded;
                    (token, "the join token of before credentials (upgraded)")
                }
                None => {
                    opening = Opening::Created;
                    let token = new_token(Role::Admin);
                    write_token(token_file, &token)?;
                    (token, "made with the data directory")
                }
            };
            let admin = credential_for(&token, Role::Admin, None, None, label, now_ms);
            change_file(data_dir, |file| {
                if file.credentials.is_empty() {
                    file.credentials.push(admin);
                }
                Ok(())
            })?;
        }
        let mut from_files = Vec::new();
        for f in files {
            let text = std::fs::read_to_string(&f.path).map_err(io(&f.path))?;
            let token = text.trim();
            if token.is_empty() {
                return Err(CredentialsError::Invalid(format!(
                    "credential file {} is empty",
                    f.path.display()
                )));
            }
            let label = format!("from {}", f.path.display());
            from_files.push(credential_for(
                token,
                f.role,
                None,
                f.node_prefix.clone(),
                &label,
                now_ms,
            ));
        }
        let mut credentials = Credentials {
            path,
            by_hash: HashMap::new(),
            from_files,
            seen: None,
        };
        credentials.reload()?;
        Ok((credentials, opening))
    }

    /// Re-reads the file when it changed since it was last read.
    fn reload(&mut self) -> Result<(), CredentialsError> {
        let modified = std::fs::metadata(&self.path)
            .and_then(|m| m.modified())
            .map_err(io(&self.path))?;
        if self.seen == Some(modified) {
            return Ok(());
        }
        let file = read_file(&self.path)?.unwrap_or_default();
        self.by_hash = self
            .from_files
            .iter()
            .chain(&file.credentials)
            .map(|c| (c.hash.clone(), c.clone()))
            .collect();
        self.seen = Some(modified);
        Ok(())
    }

    fn refresh(&mut self) {
        if let Err(e) = self.reload() {
            // The last good credentials stay in force; the operator sees why in the log.
            tracing::error!("cannot re-read {}: {e}", self.path.display());
        }
    }

    /// Who `token` is, if it is a live credential.
    pub fn authenticate(&mut self, token: Option<&str>) -> Result<Principal, AuthError> {
        let token = token.filter(|t| !t.is_empty()).ok_or(AuthError::Missing)?;
        self.refresh();
        let hash = token_hash(token);
        let c = self.by_hash.get(&hash).ok_or(AuthError::Unknown)?;
        if !same_secret(c.hash.as_bytes(), hash.as_bytes()) {
            return Err(AuthError::Unknown);
        }
        if c.revoked {
            return Err(AuthError::Revoked(c.id.clone()));
        }
        Ok(Principal::of(c))
    }

    /// Whether credential `id` is still live (not revoked, still known).
    pub fn is_live(&mut self, id: &str) -> bool {
        self.refresh();
        self.by_hash.values().any(|c| c.id == id && !c.revoked)
    }
}

/// Writes a token file readable by its owner only.
pub fn write_token(path: &Path, token: &str) -> Result<(), CredentialsError> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(io(parent))?;
    }
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(path)
        .map_err(io(path))?;
    std::io::Write::write_all(&mut f, format!("{token}\n").as_bytes()).map_err(io(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: Option<&str>, prefix: Option<&str>) -> Principal {
        Principal {
            id: "n1".into(),
            role: Role::Node,
            node: name.map(str::to_string),
            node_prefix: prefix.map(str::to_string),
        }
    }

    #[test]
    fn each_role_may_do_what_it_is_for_and_no_more() {
        let admin = Principal {
            id: "a".into(),
            role: Role::Admin,
            node: None,
            node_prefix: None,
        };
        let client = Principal {
            id: "c".into(),
            role: Role::Client,
            ..admin.clone()
        };
        assert!(admin.node_refusal("any").is_none());
        assert!(admin.cancel_refusal("someone-else").is_none());
        assert!(client.node_refusal("n").is_some());
        assert!(client.client_refusal().is_none());
        assert!(client.cancel_refusal("c").is_none());
        assert!(client.cancel_refusal("other").is_some());
        let bound = node(Some("gpu-1"), None);
        assert!(bound.node_refusal("gpu-1").is_none());
        assert!(bound.node_refusal("gpu-2").unwrap().contains("gpu-1"));
        assert!(bound.client_refusal().is_some());
        let pool = node(None, Some("rb-docker-"));
        assert!(pool.node_refusal("rb-docker-abc").is_none());
        assert!(pool.node_refusal("rb-process-abc").is_some());
    }

    #[test]
    fn a_data_directory_with_a_join_token_upgrades_to_an_admin_credential() {
        let dir = tempfile::tempdir().unwrap();
        let token_file = dir.path().join("token");
        std::fs::write(&token_file, "old-join-token-0123\n").unwrap();
        let (mut c, opening) = Credentials::open(dir.path(), &token_file, &[], 1).unwrap();
        assert_eq!(opening, Opening::Upgraded);
        let admin = c.authenticate(Some("old-join-token-0123")).unwrap();
        assert_eq!(admin.role, Role::Admin);
        let text = std::fs::read_to_string(dir.path().join(CREDENTIALS_FILE)).unwrap();
        assert!(
            !text.contains("old-join-token-0123"),
            "only hashes are kept"
        );
        // Opened again: nothing changes.
        let (_, again) = Credentials::open(dir.path(), &token_file, &[], 2).unwrap();
        assert_eq!(again, Opening::Existing);
    }

    #[test]
    fn added_credentials_work_at_once_and_revoked_ones_stop() {
        let dir = tempfile::tempdir().unwrap();
        let token_file = dir.path().join("token");
        let (mut c, opening) = Credentials::open(dir.path(), &token_file, &[], 1).unwrap();
        assert_eq!(opening, Opening::Created);
        let admin_token = std::fs::read_to_string(&token_file).unwrap();
        assert!(admin_token.starts_with("rb-admin-"));
        assert_eq!(
            c.authenticate(Some(admin_token.trim())).unwrap().role,
            Role::Admin
        );
        let (cred, token) = add(dir.path(), Role::Client, None, None, "ci", 2).unwrap();
        // The file's mtime may not move within its granularity: force a re-read.
        c.seen = None;
        assert_eq!(c.authenticate(Some(&token)).unwrap().id, cred.id);
        assert_eq!(
            c.authenticate(Some("rb-client-guess")),
            Err(AuthError::Unknown)
        );
        assert_eq!(c.authenticate(None), Err(AuthError::Missing));
        revoke(dir.path(), &cred.id[..6]).unwrap();
        c.seen = None;
        assert_eq!(
            c.authenticate(Some(&token)),
            Err(AuthError::Revoked(cred.id.clone()))
        );
        assert!(!c.is_live(&cred.id));
        assert!(matches!(
            revoke(dir.path(), "zzzz"),
            Err(CredentialsError::NoSuchId(_))
        ));
        assert!(add(dir.path(), Role::Node, None, None, "x", 3).is_err());
        assert!(add(dir.path(), Role::Client, Some("n".into()), None, "x", 3).is_err());
    }

    #[test]
    fn file_credentials_name_their_role_and_pool() {
        let f: FileCredential = "node:rb-docker-=/s/token".parse().unwrap();
        assert_eq!(f.role, Role::Node);
        assert_eq!(f.node_prefix.as_deref(), Some("rb-docker-"));
        let c: FileCredential = "client=/s/client".parse().unwrap();
        assert_eq!((c.role, c.node_prefix), (Role::Client, None));
        assert!("node=/s/t".parse::<FileCredential>().is_err());
        assert!("client:x=/s/t".parse::<FileCredential>().is_err());
        assert!("root=/s/t".parse::<FileCredential>().is_err());
    }
}
