//! `reprobench credential`: the coordinator's credentials, managed where its data directory is.

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use reprobench_coordinator::credentials::{self, Role};
use std::path::PathBuf;

/// Options of `reprobench credential`.
#[derive(Args)]
pub struct CredentialArgs {
    /// The coordinator's data directory (run this on its machine; in Kubernetes, in its pod).
    #[arg(
        long,
        value_name = "DIR",
        default_value = "reprobench-data",
        global = true
    )]
    data: PathBuf,
    #[command(subcommand)]
    which: CredentialCommand,
}

#[derive(Subcommand)]
enum CredentialCommand {
    /// Make a credential and print its token (shown once: only its hash is kept). A running
    /// coordinator takes it at once.
    Add {
        /// `client` (submit, watch, results, cancel its own runs), `node` (register and work as
        /// the nodes it binds) or `admin` (everything).
        #[arg(long, value_name = "ROLE")]
        role: String,
        /// A node credential for this node name only (`reprobench node --name NAME`).
        #[arg(long, value_name = "NAME", conflicts_with = "node_prefix")]
        node: Option<String>,
        /// A node credential for a pool: nodes whose names start with PREFIX.
        #[arg(long, value_name = "PREFIX")]
        node_prefix: Option<String>,
        /// Who holds it, for `list`.
        #[arg(long, value_name = "TEXT", default_value = "")]
        label: String,
        /// Write the token to this file (mode 0600) instead of printing it.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// List the credentials: id, role, binding, label, revoked (never tokens).
    List,
    /// Revoke a credential by id (or a unique start of it): refused from now on, and a node
    /// using it is disconnected.
    Revoke {
        /// The credential's id, from `list`.
        id: String,
    },
}

/// Runs `reprobench credential …`.
pub fn credential(a: CredentialArgs) -> Result<()> {
    if !a.data.join(credentials::CREDENTIALS_FILE).exists() {
        bail!(
            "{} has no {}: start the coordinator on it once (`reprobench serve --data {}`), which makes the admin credential",
            a.data.display(),
            credentials::CREDENTIALS_FILE,
            a.data.display()
        );
    }
    match a.which {
        CredentialCommand::Add {
            role,
            node,
            node_prefix,
            label,
            out,
        } => {
            let role = Role::parse(&role)
                .with_context(|| format!("--role {role}: the roles are client, node and admin"))?;
            if let Some(name) = &node {
                reprobench_domain::ids::check_name(name)
                    .map_err(|rule| anyhow::anyhow!("--node {name:?}: {rule}"))?;
            }
            let now = reprobench_domain::time::now_ms();
            let (credential, token) =
                credentials::add(&a.data, role, node, node_prefix, &label, now)?;
            match out {
                Some(path) => {
                    credentials::write_token(&path, &token)?;
                    eprintln!(
                        "{} credential {} written to {} (pass it with --token-file)",
                        role.as_str(),
                        credential.id,
                        path.display()
                    );
                }
                None => {
                    eprintln!(
                        "{} credential {} (shown once; save it to a file and pass --token-file):",
                        role.as_str(),
                        credential.id
                    );
                    println!("{token}");
                }
            }
        }
        CredentialCommand::List => {
            println!(
                "{:<14} {:<7} {:<24} {:<8} LABEL",
                "ID", "ROLE", "BINDS", "STATE"
            );
            for c in credentials::list(&a.data)? {
                let binds = match (&c.node, &c.node_prefix) {
                    (Some(n), _) => n.clone(),
                    (None, Some(p)) => format!("{p}*"),
                    _ => "-".into(),
                };
                let state = if c.revoked { "revoked" } else { "live" };
                println!(
                    "{:<14} {:<7} {:<24} {:<8} {}",
                    c.id,
                    c.role.as_str(),
                    binds,
                    state,
                    c.label
                );
            }
        }
        CredentialCommand::Revoke { id } => {
            let c = credentials::revoke(&a.data, &id)?;
            eprintln!(
                "revoked {} credential {} ({})",
                c.role.as_str(),
                c.id,
                c.label
            );
        }
    }
    Ok(())
}
