//! `reprobench`: one binary with a subcommand per role. Arguments and wiring only; the work
//! lives in the crates (`reprobench-coordinator`, `reprobench-agent-node`, `reprobench-analysis`).

mod bench;
mod bench_tools;
mod bundled;
mod client;
mod credential_cmd;
mod datasets;
mod eval;
mod gateway_cmd;
mod grade;
mod lite_figures;
mod local;
mod oracle_cmd;
mod quickstart;
mod review;
mod slice_all;
mod swt_report;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use reprobench_domain::kind::SlotSpec;
use reprobench_sandbox::StageAheadMode;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Default data directory for local runs and `serve`.
const DEFAULT_DATA: &str = "reprobench-data";

#[derive(Parser)]
#[command(
    name = "reprobench",
    version,
    about = "Distributed benchmark harness for LLM bug-reproduction agents",
    long_about = "Distributed benchmark harness for LLM bug-reproduction agents.\n\n\
        A coordinator (`serve`) holds runs in a SQLite store and schedules their tasks on agent \
        nodes (`node`). `run --local-nodes N` starts both on this machine; `quickstart` shows it \
        end to end. Results follow one schema (see `results`)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The main job on built-in data: swt-mini evaluated SWT-bench style and android-sim on
    /// simulated devices, on a local cluster, with summary tables (LLM agents too when
    /// REPROBENCH_BASE_URL/REPROBENCH_MODEL/REPROBENCH_API_KEY name a backbone).
    Quickstart(QuickstartArgs),
    /// Run the coordinator: store, scheduler, and the gRPC services nodes and users call.
    Serve(ServeArgs),
    /// Run an agent node that joins a coordinator and executes tasks in its slots.
    #[command(after_long_help = reprobench_domain::registry::help_text())]
    Node(NodeArgs),
    /// Submit a sweep and wait for it, with progress on stderr.
    #[command(after_long_help = reprobench_domain::registry::help_text())]
    Run(RunArgs),
    /// Show runs (or one run, with --attempts its attempts and their reasons).
    Status(StatusArgs),
    /// Cancel a run: pending tasks are withdrawn, running attempts stopped.
    Cancel(CancelArgs),
    /// Export a run's results in the results schema.
    Results(ResultsArgs),
    /// Evaluate predictions (or gold test patches) on an SWT dataset, SWT-bench style, over the cluster.
    Eval(eval::EvalArgs),
    /// Grade instances from their six execution logs as SWT-bench does, with no execution; or
    /// regrade a finished run from the logs it kept (--run).
    Grade(grade::GradeArgs),
    /// List, inspect, check, prepare or fetch datasets.
    Datasets(DatasetsArgs),
    /// Build the images the docker executor needs, without any registry.
    Images(ImagesArgs),
    /// Paper tables from results files (main, ablation, repo, backbone, overlap, localization, cost).
    Tables(TablesArgs),
    /// Regression gate: per-instance flips, exact McNemar test, bootstrap CI; exit 1 on a significant drop.
    Compare(CompareArgs),
    /// One self-contained HTML report: tables, plots and a per-instance drill-down.
    Report(ReportArgs),
    /// Convert published per-instance results into the results schema.
    Import(ImportArgs),
    /// Human verdicts for non-crash Android results: two reviewers, a third breaks ties (LTGDroid's protocol).
    #[command(long_about = review::PROTOCOL)]
    Review(review::ReviewArgs),
    /// The metering LLM gateway on its own: an OpenAI-compatible proxy to one backbone.
    Gateway(gateway_cmd::GatewayArgs),
    /// Credentials of a coordinator (node, client, admin): add, list, revoke.
    Credential(credential_cmd::CredentialArgs),
    /// Benchmarks (figures, not pass/fail).
    Bench(BenchArgs),
    /// A stand-in backbone that plays a perfect model: it answers the built-in agents from the
    /// golden patches (SWT) and ground-truth traces (android-sim) it is given. An oracle, not a
    /// language model: it proves the pipeline from agent to verdict, never an agent's quality.
    Oracle(oracle_cmd::OracleArgs),
}

/// Where a client finds the coordinator or its store.
#[derive(Args, Clone)]
struct Target {
    /// Data directory: the local cluster's with --local-nodes; otherwise a coordinator's on this
    /// machine (its store is read directly where possible) [default: reprobench-data].
    #[arg(long, value_name = "DIR", conflicts_with = "coordinator")]
    data: Option<PathBuf>,
    /// Coordinator URL, e.g. http://10.0.0.5:7077.
    #[arg(long, value_name = "URL", requires = "token_file")]
    coordinator: Option<String>,
    /// File holding the join token (the coordinator's DATA_DIR/token).
    #[arg(long, value_name = "F")]
    token_file: Option<PathBuf>,
    /// CA certificate (PEM) for an https coordinator.
    #[arg(long, value_name = "F")]
    tls_ca: Option<PathBuf>,
    /// The name the coordinator's certificate carries, when --coordinator reaches it by another
    /// (an IP address, or 127.0.0.1 through `kubectl port-forward`).
    #[arg(long, value_name = "NAME", requires = "tls_ca")]
    tls_server_name: Option<String>,
}

/// `--stage-ahead`'s values (`reprobench_sandbox::StageAheadMode`).
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum StageAheadArg {
    /// Never.
    Off,
    /// When a core is idle as an execution's command starts.
    WhenIdle,
    /// Always.
    Always,
}

/// A node's settings, for every executor kind: where SWT executors find repositories and keep
/// caches, the docker image and disk, the android simulator and emulators, and what the node lets
/// a sweep run (for `node`, and the local nodes of `run`, `eval` and `quickstart`).
#[derive(Args, Clone)]
pub struct NodeOptions {
    /// Directory of bare repository mirrors named OWNER__NAME.git [default: DATASETS/repos].
    #[arg(long, value_name = "DIR")]
    repos: Option<PathBuf>,
    /// Cache of environments and of gold/base executions [default: ~/.cache/reprobench].
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
    /// Where each attempt's files (test patch, logs, report) go [default: CACHE/artifacts].
    #[arg(long, value_name = "DIR")]
    artifacts: Option<PathBuf>,
    /// Base image of the docker executor (built by `reprobench images bootstrap`, or any image with Python).
    #[arg(long, value_name = "IMAGE", default_value = reprobench_sandbox::docker::DEFAULT_BASE_IMAGE)]
    base_image: String,
    /// Disk the docker executor's environment and instance images may use (GiB); least recently used go first.
    #[arg(long, value_name = "GIB", default_value_t = 20)]
    image_budget_gb: u64,
    /// Make every docker execution create and start its own container (and stage its own
    /// tree). By default the next execution's container is booted, and its copy of the
    /// repository made, while an execution of the same instance runs; this flag is the baseline
    /// that measures what that buys.
    #[arg(long)]
    no_boot_ahead: bool,
    /// When the tree (copy, patches, seal) of an instance's next execution is staged while one
    /// runs (process: in a directory of its own; docker: in the container booted ahead for it):
    /// `when-idle` (a core is idle then, so it takes no CPU from running tests; on docker the
    /// container of the node's next task also boots only then), `always`, or `off` (each
    /// execution stages its own tree on its path: the baseline that measures what staging
    /// ahead buys).
    #[arg(long, value_enum, value_name = "WHEN", default_value = "when-idle")]
    stage_ahead: StageAheadArg,
    /// Ignore the coordinator's hint of this node's next task. By default, while a task's last
    /// execution runs, the first execution of the task the coordinator will most likely grant
    /// next is announced, so its container is booted (docker) and its tree staged as
    /// `--stage-ahead` says; this flag is the baseline that measures what that buys.
    #[arg(long)]
    no_next_task_ahead: bool,
    /// Replay recorded LLM transcripts (a file or directory) instead of calling backbones: runs
    /// are deterministic re-runs and are reported as replays.
    #[arg(long, value_name = "PATH")]
    replay: Option<PathBuf>,
    /// The simulator's suite of apps and reports [default: DATASETS/android-sim].
    #[arg(long, value_name = "DIR")]
    android_sim: Option<PathBuf>,
    /// Factor on the simulator's latency model: 0 runs instantly, 1 waits as an emulator would
    /// (action ≈ 2 s, snapshot load ≈ 0.65 s).
    #[arg(long, value_name = "F", default_value_t = 0.0)]
    sim_latency_scale: f64,
    /// Device replicas ltgdroid pre-assesses each screen's candidate actions on, in parallel
    /// (K; the original runs them one after another, K = 1).
    #[arg(long, value_name = "K", default_value_t = reprobench_android::executor::DEFAULT_PREASSESS_REPLICAS)]
    preassess_replicas: usize,
    /// The Android `emulator` binary the `emulator` executor launches [default: emulator on PATH].
    #[arg(long, value_name = "PATH")]
    emulator: Option<PathBuf>,
    /// The `adb` binary the `emulator` executor drives devices with [default: adb on PATH].
    #[arg(long, value_name = "PATH")]
    adb: Option<PathBuf>,
    /// The AVD every emulator runs (required to offer `emulator` slots).
    #[arg(long, value_name = "NAME")]
    avd: Option<String>,
    /// How many emulators the node runs at most [default: its emulator slots].
    #[arg(long, value_name = "N")]
    emulators: Option<u16>,
    /// Directory of the APKs android reports name (e.g. ActivityDiary_v1.1.8.apk).
    #[arg(long, value_name = "DIR")]
    apks: Option<PathBuf>,
    /// Directory of the android datasets (manifests, rows, fetched reports) the `emulator`
    /// executor reads [default: ./datasets].
    #[arg(long, value_name = "DIR")]
    android_datasets: Option<PathBuf>,
    /// Run process executions even where this node cannot isolate them (no bubblewrap, or a
    /// kernel or container that refuses it the namespaces of an execution's sandbox). Off, such
    /// a node refuses them with an error saying why; on, they run as plain processes, nothing
    /// of the harness hidden from them, and every report says they ran unisolated.
    #[arg(long)]
    allow_unisolated_process: bool,
    /// Run agents a sweep supplies as a command or an image (`[[agents]] command`/`image`).
    /// They run with this node's network and environment, so only allow them where everyone
    /// who can submit a sweep may run code here. Off, such tasks end with an error saying so.
    #[arg(long)]
    allow_agent_commands: bool,
    /// Run an environment's own `pre_install`/`install`/`eval_commands` when they are not those
    /// of SWT-bench's specs or reprobench's datasets (on process nodes they run outside the
    /// sandbox). Off, such tasks end with an error saying so.
    #[arg(long)]
    allow_env_commands: bool,
    /// An environment variable a sweep's backbone may read its API key from (`api_key_env`);
    /// repeat for more. A sweep can make the node send an allowed key to the URL it names, so
    /// declare only keys meant for such use. None by default.
    #[arg(long = "allow-key-env", value_name = "VAR")]
    allow_key_envs: Vec<String>,
    /// A host a backbone may reach over plain http:// besides this machine (https:// may name
    /// any host); repeat for more.
    #[arg(long = "allow-http-host", value_name = "HOST")]
    allow_http_hosts: Vec<String>,
}

impl NodeOptions {
    /// The defaults, as if no flag was given (clap's, from the attributes above).
    pub fn defaults() -> NodeOptions {
        #[derive(Parser)]
        struct NoFlags {
            #[command(flatten)]
            node: NodeOptions,
        }
        NoFlags::parse_from(["reprobench"]).node
    }

    fn absolute(p: PathBuf) -> PathBuf {
        std::path::absolute(&p).unwrap_or(p)
    }

    /// The node settings these arguments describe.
    pub fn settings(&self) -> reprobench_agent_node::runtime::SwtSettings {
        let mut s = reprobench_agent_node::runtime::SwtSettings::default();
        if let Some(c) = &self.cache_dir {
            s.cache_dir = c.clone();
            s.artifacts = c.join("artifacts");
            s.docker.cache_dir = c.clone();
        }
        if let Some(r) = &self.repos {
            s.repos = r.clone();
        }
        if let Some(a) = &self.artifacts {
            s.artifacts = a.clone();
        }
        s.docker.base_image = self.base_image.clone();
        s.replay = self.replay.clone().map(Self::absolute);
        if let Some(d) = &self.android_sim {
            s.android_sim = d.clone();
        }
        s.android_sim = Self::absolute(s.android_sim);
        s.sim_latency_scale = self.sim_latency_scale.max(0.0);
        s.preassess_replicas = self.preassess_replicas.max(1);
        s.docker.disk_budget_bytes = self.image_budget_gb << 30;
        s.docker.boot_ahead = !self.no_boot_ahead;
        s.next_task_ahead = !self.no_next_task_ahead;
        s.stage_ahead = match self.stage_ahead {
            StageAheadArg::Off => StageAheadMode::Off,
            StageAheadArg::WhenIdle => StageAheadMode::WhenIdle,
            StageAheadArg::Always => StageAheadMode::Always,
        };
        s.repos = Self::absolute(s.repos);
        s.cache_dir = Self::absolute(s.cache_dir);
        s.artifacts = Self::absolute(s.artifacts);
        s.allow_unisolated_process = self.allow_unisolated_process;
        s.code = reprobench_agent_node::runtime::CodePolicy {
            agent_commands: self.allow_agent_commands,
            env_commands: self.allow_env_commands,
            key_envs: Some(self.allow_key_envs.clone()),
            http_hosts: self.allow_http_hosts.clone(),
            ..Default::default()
        };
        s.emulator = self.avd.as_ref().map(|avd| {
            use reprobench_android::emulator::EmulatorSettings;
            let mut e = EmulatorSettings::new(
                avd,
                Self::absolute(self.apks.clone().unwrap_or_else(|| PathBuf::from("apks"))),
                Self::absolute(
                    self.android_datasets
                        .clone()
                        .unwrap_or_else(reprobench_domain::swt::default_datasets_dir),
                ),
                s.artifacts.clone(),
            );
            if let Some(p) = &self.emulator {
                e.emulator = p.clone();
            }
            if let Some(p) = &self.adb {
                e.adb = p.clone();
            }
            e.emulators = self.emulators.unwrap_or(0);
            e
        });
        s
    }

    /// The settings of a local node (of `run`, `eval`, `quickstart`): these, with the sweep's
    /// own code and keys allowed, since the one who submits is the one whose machine it is.
    pub fn local_settings(&self) -> reprobench_agent_node::runtime::SwtSettings {
        let mut s = self.settings();
        s.code = reprobench_agent_node::runtime::CodePolicy::own_user();
        s
    }

    /// [`Self::local_settings`] as `reprobench node` arguments: one typed value
    /// (`--settings-json`, paths absolute), so a node flag is defined in this struct only.
    pub fn node_args(&self) -> Vec<String> {
        let settings = serde_json::to_string(&self.local_settings())
            .expect("node settings are paths, numbers and strings");
        vec!["--settings-json".into(), settings]
    }
}

#[derive(Args)]
struct TablesArgs {
    /// Results files in the results schema (JSONL or Parquet), e.g. from `reprobench results RUN`.
    #[arg(long = "results", value_name = "FILE", num_args = 1..)]
    results: Vec<PathBuf>,
    /// Table kind: main, ablation, repo, backbone, overlap, localization, cost.
    #[arg(long, default_value = "main")]
    kind: String,
    /// Output: term, md, latex (booktabs), csv, json.
    #[arg(long, default_value = "term")]
    format: String,
    /// A paper's aggregated figures to set beside yours (CSV with Method and columns such as overall_sr_pct).
    #[arg(long, value_name = "CSV")]
    published: Option<PathBuf>,
    /// Row whose relative improvement over every other row is printed, (ref − other) / other.
    #[arg(long, value_name = "NAME")]
    reference: Option<String>,
    /// Tabulate results graded under different versions of SWT-bench's rules (refused otherwise).
    #[arg(long)]
    mixed_rules: bool,
}

#[derive(Args)]
struct CompareArgs {
    /// Results of the new run (JSONL or Parquet).
    #[arg(long, value_name = "FILE")]
    results: PathBuf,
    /// Results of the baseline run.
    #[arg(long, value_name = "FILE")]
    baseline: PathBuf,
    /// Largest tolerated drop in success rate, in percentage points.
    #[arg(long, value_name = "PP", default_value_t = 0.0)]
    max_drop: f64,
    /// Compare results graded under different versions of SWT-bench's rules (refused otherwise).
    #[arg(long)]
    mixed_rules: bool,
}

#[derive(Args)]
struct ReportArgs {
    /// Results files (JSONL or Parquet).
    #[arg(long = "results", value_name = "FILE", num_args = 1.., required = true)]
    results: Vec<PathBuf>,
    /// The HTML file to write.
    #[arg(long, value_name = "FILE", default_value = "report.html")]
    out: PathBuf,
}

#[derive(Args)]
struct ImportArgs {
    #[command(subcommand)]
    what: ImportWhat,
}

#[derive(Subcommand)]
enum ImportWhat {
    /// A SWE-bench or SWT-bench report JSON (resolved_ids/unresolved_ids..., or category → ids).
    SwebenchReport {
        /// The report file.
        file: PathBuf,
        /// Agent name for the rows.
        #[arg(long)]
        agent: String,
        /// Dataset name for the rows.
        #[arg(long, default_value = "swt-lite")]
        dataset: String,
        /// Output (JSONL; `.parquet` writes Parquet).
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
        /// The SWT-bench rules the report was graded under (swt-bench-2024 for results published
        /// before 2025-09-11), recorded on every row so tables do not mix versions.
        #[arg(long, value_name = "RULES")]
        rules: Option<reprobench_domain::grading::Rules>,
    },
}

#[derive(Args)]
struct DatasetsArgs {
    #[command(subcommand)]
    command: DatasetsCommand,
    /// Datasets directory [default: ./datasets].
    #[arg(long, value_name = "DIR", global = true)]
    datasets: Option<PathBuf>,
}

#[derive(Subcommand)]
enum DatasetsCommand {
    /// The datasets this checkout knows, and whether their rows are here.
    List,
    /// A dataset's repositories and instances.
    Show {
        /// Name, directory or rows file.
        name: String,
        /// Environment map for a rows file.
        #[arg(long, value_name = "FILE")]
        env: Option<PathBuf>,
    },
    /// Check every row and instance; exit status 1 on any problem.
    Validate {
        /// Name, directory or rows file.
        name: String,
        /// Environment map for a rows file.
        #[arg(long, value_name = "FILE")]
        env: Option<PathBuf>,
    },
    /// Build the repository mirrors of a dataset that ships its sources (swt-mini).
    Prepare {
        /// Dataset name.
        name: String,
        /// Mirror directory [default: DATASETS/repos].
        #[arg(long, value_name = "DIR")]
        repos: Option<PathBuf>,
    },
    /// Unpack repository mirrors given as tarballs (`OWNER__NAME.git.tar.gz`, a bare repository
    /// each; a directory of them is taken whole) into the mirror directory, for machines that
    /// cannot clone from GitHub. Mirrors already there are kept.
    Import {
        /// Tarballs, or directories holding them.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Mirror directory [default: DATASETS/repos].
        #[arg(long, value_name = "DIR")]
        repos: Option<PathBuf>,
    },
    /// Download a dataset's rows and environment specs and mirror its repositories (SWT), or
    /// its bug reports from the GitHub issues API (android-ltg75; GITHUB_TOKEN is used when set,
    /// REPROBENCH_GITHUB_API overrides the API base; files already there are kept).
    Fetch {
        /// Dataset name (swt-lite, swt-verified, android-ltg75).
        name: String,
        /// Mirror directory [default: DATASETS/repos].
        #[arg(long, value_name = "DIR")]
        repos: Option<PathBuf>,
    },
}

#[derive(Args)]
struct ImagesArgs {
    #[command(subcommand)]
    command: ImagesCommand,
}

#[derive(Subcommand)]
enum ImagesCommand {
    /// Build the Python base image from Debian packages (debootstrap + docker import): no registry needed.
    Bootstrap {
        /// Tag of the image.
        #[arg(long, default_value = reprobench_sandbox::docker::DEFAULT_BASE_IMAGE)]
        tag: String,
        /// Debian suite.
        #[arg(long, default_value = "bookworm")]
        suite: String,
        /// Debian mirror.
        #[arg(long, default_value = "http://deb.debian.org/debian")]
        mirror: String,
        /// Rebuild even if the tag exists.
        #[arg(long)]
        force: bool,
    },
    /// Build reprobench's own image (this binary over the base image), the one the Helm chart runs:
    /// no registry needed; push it to yours with `docker tag` and `docker push` for a cluster.
    #[command(name = "self")]
    SelfImage {
        /// Tag of the image.
        #[arg(long, default_value = SELF_IMAGE)]
        tag: String,
        /// Base image (built by `images bootstrap`).
        #[arg(long, default_value = reprobench_sandbox::docker::DEFAULT_BASE_IMAGE)]
        base: String,
        /// Rebuild even if the tag exists.
        #[arg(long)]
        force: bool,
    },
}

/// The tag `images self` builds and the chart's `image` values default to.
const SELF_IMAGE: &str = concat!("reprobench/reprobench:", env!("CARGO_PKG_VERSION"));

#[derive(Args)]
struct QuickstartArgs {
    /// Data directory for the local cluster's store.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_DATA)]
    data: PathBuf,
    /// Node processes to start.
    #[arg(long, default_value_t = 2)]
    local_nodes: u32,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct ServeArgs {
    /// Data directory: store, token, address file.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_DATA)]
    data: PathBuf,
    /// Address to listen on (port 0 picks a free port; the address is written to DIR/serve.json).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7077")]
    listen: SocketAddr,
    /// Join token file; generated with mode 0600 if absent [default: DIR/token].
    #[arg(long, value_name = "F")]
    token_file: Option<PathBuf>,
    /// TLS certificate (PEM); with --tls-key, serve https.
    #[arg(long, value_name = "F", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// TLS private key (PEM).
    #[arg(long, value_name = "F", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Lease length: an attempt whose node is silent this long is requeued.
    #[arg(long, value_name = "MS", default_value_t = 15_000)]
    lease_ms: u64,
    /// How often nodes heartbeat (busy or idle).
    #[arg(long, value_name = "MS", default_value_t = 3_000)]
    heartbeat_ms: u64,
    /// Serve pending and running task counts per executor kind over HTTP on this address:
    /// Prometheus text at /metrics, KEDA's metrics-api JSON at /keda?kinds=KIND,... (no token).
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<SocketAddr>,
    /// Run inside Kubernetes (the Helm chart sets it): watch this release's node pods and release
    /// a deleted or failed pod's leases at once. Uses the pod's service account.
    #[arg(long)]
    kubernetes: bool,
    /// Label selector of the node pods to watch.
    #[arg(
        long,
        value_name = "SELECTOR",
        default_value = "app.kubernetes.io/component=node",
        requires = "kubernetes"
    )]
    node_pod_selector: String,
    /// Namespace of the node pods [default: the service account's namespace].
    #[arg(long, value_name = "NS", requires = "kubernetes")]
    namespace: Option<String>,
    /// A pool the built-in scaler sizes (for clusters without KEDA; KEDA is the documented way):
    /// DEPLOYMENT:KIND[+KIND...]:SLOTS:MIN:MAX, repeatable; replicas cover the kinds' pending and
    /// running tasks at SLOTS per pod.
    #[arg(long = "scale", value_name = "POOL", requires = "kubernetes")]
    scale: Vec<reprobench_coordinator::kubernetes::ScaledPool>,
    /// How long demand must stay lower before the built-in scaler removes pods.
    #[arg(long, value_name = "S", default_value_t = 300)]
    scale_down_delay_s: u64,
    /// The most tasks one sweep may expand to (rows × variants × backbones × repeats); a larger
    /// sweep is refused before it is expanded.
    #[arg(long, value_name = "N", default_value_t = reprobench_coordinator::machine::DEFAULT_MAX_SWEEP_TASKS)]
    max_sweep_tasks: u64,
    /// The most messages (grants, cancels) that may wait unread for one node; a node that lets
    /// more pile up is disconnected with an error naming this flag, and its work goes back.
    #[arg(long, value_name = "N", default_value_t = reprobench_coordinator::core::DEFAULT_MAX_NODE_QUEUE)]
    max_node_queue: usize,
    /// The largest message (a submission with its attached datasets and predictions, a grant, a
    /// results page) taken or sent, in MiB; a larger one is refused naming this flag.
    #[arg(long, value_name = "MIB", default_value_t = (reprobench_coordinator::server::MAX_MESSAGE_BYTES >> 20) as u32, value_parser = clap::value_parser!(u32).range(1..=4096))]
    max_message_mib: u32,
    /// A credential in a file (a mounted Secret), known while serving besides those of
    /// DATA/credentials.json: client=FILE, admin=FILE, or node:PREFIX=FILE for a pool's nodes
    /// (names starting with PREFIX). Repeatable.
    #[arg(long = "credential", value_name = "ROLE=FILE")]
    credentials: Vec<reprobench_coordinator::credentials::FileCredential>,
}

#[derive(Args)]
struct NodeArgs {
    /// Coordinator URL, e.g. http://10.0.0.5:7077.
    #[arg(long, value_name = "URL")]
    coordinator: String,
    /// File holding the join token (copy of the coordinator's DATA_DIR/token).
    #[arg(long, value_name = "F")]
    token_file: PathBuf,
    /// Slots per executor kind, repeatable: --slots synthetic=4 --slots docker=1.
    #[arg(long = "slots", value_name = "KIND=N", default_value = "synthetic=2")]
    slots: Vec<SlotSpec>,
    /// Node id, stable across reconnects [default: HOSTNAME-PID].
    #[arg(long, value_name = "ID")]
    name: Option<String>,
    /// CA certificate (PEM) for an https coordinator.
    #[arg(long, value_name = "F")]
    tls_ca: Option<PathBuf>,
    /// The name the coordinator's certificate carries, when --coordinator reaches it by another.
    #[arg(long, value_name = "NAME", requires = "tls_ca")]
    tls_server_name: Option<String>,
    /// On SIGTERM, wait this long for running attempts before handing them back.
    #[arg(long, value_name = "S", default_value_t = 600)]
    drain_timeout_s: u64,
    /// The node's settings as one JSON value, in place of the flags below: how `run`, `eval`
    /// and `quickstart` start their local nodes.
    #[arg(long, value_name = "JSON", hide = true, conflicts_with = "NodeOptions")]
    settings_json: Option<String>,
    #[command(flatten)]
    swt: NodeOptions,
}

#[derive(Args)]
struct RunArgs {
    /// Sweep spec (TOML): datasets, agents, variants, backbones, repeats, budget.
    sweep: PathBuf,
    /// Start an embedded coordinator and N node processes on this machine.
    #[arg(long, value_name = "N", conflicts_with = "coordinator")]
    local_nodes: Option<u32>,
    /// Slots of each local node, repeatable [default: 2 of each kind the sweep needs: synthetic
    /// for synthetic datasets, the `[eval] executor` for SWT datasets].
    #[arg(long, value_name = "KIND=N", requires = "local_nodes")]
    node_slots: Vec<SlotSpec>,
    #[command(flatten)]
    target: Target,
    /// Print one JSON object with the run's totals on stdout at the end.
    #[arg(long)]
    json: bool,
    /// Submit and return at once, printing the run id.
    #[arg(long, conflicts_with = "local_nodes")]
    detach: bool,
    /// Start a new run even if an unfinished run of the same sweep exists (default: resume it).
    #[arg(long)]
    new: bool,
    /// Datasets directory for the sweep's named datasets [default: ./datasets].
    #[arg(long, value_name = "DIR")]
    datasets: Option<PathBuf>,
    #[command(flatten)]
    node: NodeOptions,
}

impl RunArgs {
    fn datasets_dir(&self) -> PathBuf {
        self.datasets
            .clone()
            .unwrap_or_else(reprobench_domain::swt::default_datasets_dir)
    }
}

#[derive(Args)]
struct StatusArgs {
    /// Run id; all runs when omitted.
    run: Option<String>,
    #[command(flatten)]
    target: Target,
    /// List the run's attempts with their node, status and reason.
    #[arg(long, requires = "run")]
    attempts: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct CancelArgs {
    /// Run id.
    run: String,
    #[command(flatten)]
    target: Target,
}

#[derive(Clone, Copy, ValueEnum)]
enum ResultsFormat {
    Jsonl,
    Csv,
    Parquet,
}

#[derive(Args)]
struct ResultsArgs {
    /// Run id.
    run: String,
    #[command(flatten)]
    target: Target,
    /// Output format.
    #[arg(long, value_enum, default_value = "jsonl")]
    format: ResultsFormat,
    /// Write to this file instead of stdout.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
}

#[derive(Args)]
struct BenchArgs {
    #[command(subcommand)]
    which: BenchWhich,
}

#[derive(Subcommand)]
enum BenchWhich {
    /// Scheduler: makespan against its lower bound (ours and static sharding), dispatch rate, large-scale simulation.
    Scheduler(bench::SchedulerBenchArgs),
    /// SWT evaluation: harness overhead per execution against the test command's own time, and
    /// gold validation of swt-mini on 1 and on 2 local nodes.
    Eval(bench::EvalBenchArgs),
    /// Tables: the main and overlap tables over many synthetic result rows (polars).
    Tables(bench::TablesBenchArgs),
    /// LLM gateway: added latency per call (p50, p99) and throughput at 64 concurrent calls,
    /// against a scripted upstream.
    Gateway(gateway_cmd::GatewayBenchArgs),
    /// ltgdroid pre-assessment: wall time per android-sim report with K = 1 and K = 4 device
    /// replicas under the simulator's latency model, at equal success (scripted stand-in LLM).
    Preassess(bench::PreassessBenchArgs),
    /// Grading: cases per second of `grade` over the SWT-bench parity corpus (with and without
    /// reading the files), agreement with SWT-bench's verdicts, and each parser on one 40 KB log.
    Grade(bench::GradeBenchArgs),
    /// The real SWT-bench slice: gold validation cold and warm on 1 and 2 local nodes, a
    /// prediction set once gold and base are cached, harness overhead per execution, disk used;
    /// on docker, the prediction set without and with containers booted ahead.
    Slice(bench::SliceBenchArgs),
    /// The agents' repository tools on a real checkout: code-graph build time and resident
    /// memory with N concurrent tasks, each with its own graph and sharing one per commit, and
    /// grep's latency per call.
    Tools(bench_tools::ToolsBenchArgs),
}

fn init_tracing(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("REPROBENCH_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // Commands that print a listing and serve nothing behave like other command-line tools when
    // piped into `head`: they stop quietly on a closed pipe. Every other command keeps SIGPIPE
    // ignored (Rust's default), so a peer that hangs up on a socket is an error to handle, never
    // a kill: with the default disposition, a client dropping its connection mid-reply (an
    // oversized submission refused, say) killed the coordinator.
    if matches!(
        cli.command,
        Command::Status(_)
            | Command::Results(_)
            | Command::Tables(_)
            | Command::Compare(_)
            | Command::Grade(_)
            | Command::Import(_)
    ) {
        // SAFETY: setting a signal disposition before any thread starts.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    bundled::settle_datasets_dir();
    let quiet_default = "warn";
    init_tracing(match cli.command {
        Command::Serve(_) | Command::Node(_) => "info",
        _ => quiet_default,
    });
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(dispatch(cli.command)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn dispatch(command: Command) -> Result<std::process::ExitCode> {
    match command {
        Command::Quickstart(a) => quickstart::quickstart(&a.data, a.local_nodes, a.json).await?,
        Command::Serve(a) => serve(a).await?,
        Command::Node(a) => node(a).await?,
        Command::Run(a) => return client::run(a).await,
        Command::Status(a) => client::status(a).await?,
        Command::Cancel(a) => client::cancel(a).await?,
        Command::Results(a) => client::results(a).await?,
        Command::Eval(a) => return eval::eval(a).await,
        Command::Grade(a) => return grade::grade(a),
        Command::Datasets(a) => return datasets_command(a).await,
        Command::Images(a) => images_command(a).await?,
        Command::Tables(a) => tables_command(a)?,
        Command::Compare(a) => return compare_command(a),
        Command::Report(a) => report_command(a)?,
        Command::Import(a) => import_command(a)?,
        Command::Review(a) => review::review(a)?,
        Command::Bench(a) => match a.which {
            BenchWhich::Scheduler(b) => bench::scheduler(b).await?,
            BenchWhich::Eval(b) => bench::eval(b).await?,
            BenchWhich::Tables(b) => bench::tables(b)?,
            BenchWhich::Gateway(b) => gateway_cmd::bench(b).await?,
            BenchWhich::Preassess(b) => bench::preassess(b).await?,
            BenchWhich::Grade(b) => bench::grade(b)?,
            BenchWhich::Slice(b) => bench::slice(b).await?,
            BenchWhich::Tools(b) => bench_tools::tools(b)?,
        },
        Command::Gateway(a) => gateway_cmd::gateway(a).await?,
        Command::Credential(a) => credential_cmd::credential(a)?,
        Command::Oracle(a) => oracle_cmd::oracle(a).await?,
    }
    Ok(std::process::ExitCode::SUCCESS)
}

async fn serve(a: ServeArgs) -> Result<()> {
    let cfg = reprobench_coordinator::ServeConfig {
        data_dir: a.data.clone(),
        listen: a.listen,
        token_file: a.token_file,
        tls: a.tls_cert.zip(a.tls_key),
        core: reprobench_coordinator::core::CoreConfig {
            lease_ms: a.lease_ms.max(100),
            heartbeat_ms: a.heartbeat_ms.clamp(10, a.lease_ms.max(100) / 2),
            policy: reprobench_coordinator::scheduler::Policy::AffinityStealing,
            max_sweep_tasks: a.max_sweep_tasks,
            max_node_queue: a.max_node_queue,
        },
        credential_files: a.credentials,
        max_message_bytes: (a.max_message_mib as usize) << 20,
    };
    let coordinator = reprobench_coordinator::start(cfg)
        .await
        .context("starting the coordinator")?;
    eprintln!(
        "reprobench coordinator listening on {} (data {}, admin credential {})",
        coordinator.addr,
        a.data.display(),
        coordinator.token_file.display()
    );
    if coordinator.credentials_opening == reprobench_coordinator::credentials::Opening::Upgraded {
        eprintln!(
            "upgraded: the join token in {} is now an admin credential (it may do everything). Give nodes node credentials and clients client credentials: `reprobench credential add --role node --node NAME --data {}` (or --role client)",
            coordinator.token_file.display(),
            a.data.display()
        );
    }
    if let Some(addr) = a.metrics_listen {
        let bound = reprobench_coordinator::metrics::serve(addr, coordinator.core())
            .await
            .with_context(|| format!("serving metrics on --metrics-listen {addr}"))?;
        eprintln!("task counts for autoscalers on http://{bound}/metrics and /keda");
    }
    if a.kubernetes {
        use reprobench_coordinator::kubernetes;
        let client = kube::Client::try_default().await.context(
            "--kubernetes: cannot reach the Kubernetes API with this pod's service account (or ~/.kube/config)",
        )?;
        let namespace = a
            .namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_string());
        let (c, ns, selector, core) = (
            client.clone(),
            namespace.clone(),
            a.node_pod_selector.clone(),
            coordinator.core(),
        );
        tokio::spawn(async move { kubernetes::watch_node_pods(c, &ns, &selector, core).await });
        let (c, ns, selector, core) = (
            client.clone(),
            namespace.clone(),
            a.node_pod_selector.clone(),
            coordinator.core(),
        );
        tokio::spawn(async move {
            kubernetes::keep_deletion_costs(c, &ns, &selector, core, Duration::from_secs(2)).await
        });
        if !a.scale.is_empty() {
            let (pools, core) = (a.scale.clone(), coordinator.core());
            let delay = Duration::from_secs(a.scale_down_delay_s);
            tokio::spawn(async move {
                kubernetes::run_scaler(
                    client,
                    &namespace,
                    pools,
                    Duration::from_secs(15),
                    delay,
                    core,
                )
                .await
            });
        }
    }
    let mut stop = reprobench_agent_node::runtime::stop_signals();
    let mut failure = coordinator.failure();
    tokio::select! {
        _ = stop.recv() => {}
        why = failure.wait() => {
            coordinator.shutdown().await;
            eprintln!(
                "reprobench coordinator: stopped because {why}. Runs resume from what the store holds when it starts again on the same --data {}",
                a.data.display()
            );
            // EX_IOERR, for supervisors that tell a failing disk from a stop.
            std::process::exit(74);
        }
    }
    eprintln!("stopping the coordinator; runs resume when it starts again on the same --data");
    coordinator.shutdown().await;
    Ok(())
}

async fn node(a: NodeArgs) -> Result<()> {
    let token = reprobench_proto::auth::read_token(&a.token_file)?;
    let cfg = reprobench_agent_node::NodeConfig {
        coordinator: reprobench_proto::auth::CoordinatorAddress {
            url: a.coordinator,
            token,
            tls_ca: a.tls_ca,
            tls_server_name: a.tls_server_name,
        },
        node_id: a.name.unwrap_or_else(|| {
            format!(
                "{}-{}",
                reprobench_agent_node::runtime::hostname(),
                std::process::id()
            )
        }),
        slots: a.slots,
        drain_timeout: Duration::from_secs(a.drain_timeout_s),
        max_backoff: Duration::from_secs(5),
        swt: match &a.settings_json {
            Some(json) => serde_json::from_str(json)
                .context("--settings-json: not the node settings this binary writes")?,
            None => a.swt.settings(),
        },
    };
    let mut cfg = cfg;
    // What this binary ships is what counts as reprobench's own environments.
    cfg.swt.code.shipped_envs = std::sync::Arc::new(reprobench_domain::swt::shipped_env_commands(
        crate::bundled::files().iter().copied(),
    ));
    reprobench_agent_node::run_node(cfg, reprobench_agent_node::runtime::stop_signals()).await?;
    Ok(())
}

async fn datasets_command(a: DatasetsArgs) -> Result<std::process::ExitCode> {
    let dir = a
        .datasets
        .clone()
        .unwrap_or_else(reprobench_domain::swt::default_datasets_dir);
    let repos = |r: Option<PathBuf>| r.unwrap_or_else(|| dir.join("repos"));
    match a.command {
        DatasetsCommand::List => datasets::list(&dir)?,
        DatasetsCommand::Show { name, env } => datasets::show(&name, &dir, env.as_deref())?,
        DatasetsCommand::Validate { name, env } => {
            if !datasets::validate(&name, &dir, env.as_deref())? {
                return Ok(std::process::ExitCode::FAILURE);
            }
        }
        DatasetsCommand::Prepare { name, repos: r } => datasets::prepare(&name, &dir, &repos(r))?,
        DatasetsCommand::Import { paths, repos: r } => {
            reprobench_sandbox::mirrors::import_mirrors(&paths, &repos(r), |l| println!("{l}"))?
        }
        DatasetsCommand::Fetch { name, repos: r } => {
            datasets::fetch(&name, &dir, &repos(r)).await?
        }
    }
    Ok(std::process::ExitCode::SUCCESS)
}

async fn images_command(a: ImagesArgs) -> Result<()> {
    match a.command {
        ImagesCommand::Bootstrap {
            tag,
            suite,
            mirror,
            force,
        } => {
            let opts = reprobench_sandbox::docker::BootstrapOptions {
                tag,
                suite,
                mirror,
                work_dir: std::env::temp_dir().join("reprobench-bootstrap"),
                force,
            };
            let tag = reprobench_sandbox::docker::bootstrap_base_image(&opts).await?;
            println!("{tag}");
        }
        ImagesCommand::SelfImage { tag, base, force } => {
            let tag = reprobench_sandbox::docker::build_self_image(&base, &tag, force).await?;
            println!("{tag}");
        }
    }
    Ok(())
}

fn tables_command(a: TablesArgs) -> Result<()> {
    use reprobench_analysis::{frame, table, tables};
    let format: table::Format = a.format.parse()?;
    let published = match &a.published {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("cannot read {}", p.display()))?;
            tables::parse_published(&text).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?
        }
        None => vec![],
    };
    let only_published = a.results.is_empty();
    if only_published && published.is_empty() {
        anyhow::bail!("nothing to tabulate: pass --results FILE... (and/or --published CSV)");
    }
    let df = if only_published {
        frame::to_frame(&[])?
    } else {
        frame::load(&a.results)?
    };
    reprobench_analysis::check_rules(df.column("rules")?.str()?.iter(), a.mixed_rules)?;
    let opts = tables::TableOptions {
        reference: a.reference,
        published,
    };
    let built = tables::build(&a.kind, &df, &opts)?;
    print!("{}", table::render_all(&built, format));
    Ok(())
}

fn compare_command(a: CompareArgs) -> Result<std::process::ExitCode> {
    use reprobench_analysis::{frame, regression};
    let new = frame::load_rows(&[&a.results])?;
    let old = frame::load_rows(&[&a.baseline])?;
    reprobench_analysis::check_rules(
        new.iter().chain(&old).map(|r| r.rules.as_deref()),
        a.mixed_rules,
    )?;
    let c = regression::compare(&new, &old, a.max_drop);
    print!("{}", regression::render_comparison(&c));
    if c.paired == 0 {
        anyhow::bail!("no task is in both files: compare results of the same sweep");
    }
    Ok(if c.regressed {
        std::process::ExitCode::from(1)
    } else {
        std::process::ExitCode::SUCCESS
    })
}

fn report_command(a: ReportArgs) -> Result<()> {
    let rows = reprobench_analysis::frame::load_rows(&a.results)?;
    let page = reprobench_analysis::report::page("reprobench report", rows)?;
    std::fs::write(&a.out, page).with_context(|| format!("cannot write {}", a.out.display()))?;
    eprintln!("wrote {}", a.out.display());
    Ok(())
}

fn import_command(a: ImportArgs) -> Result<()> {
    let ImportWhat::SwebenchReport {
        file,
        agent,
        dataset,
        out,
        rules,
    } = a.what;
    let text = std::fs::read_to_string(&file)
        .with_context(|| format!("cannot read {}", file.display()))?;
    let json: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", file.display()))?;
    let mut rows = reprobench_analysis::import::import_swebench_report(&json, &agent, &dataset)
        .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    if let Some(r) = rules {
        for row in &mut rows {
            row.rules = Some(r.name().to_string());
        }
    }
    let f =
        std::fs::File::create(&out).with_context(|| format!("cannot create {}", out.display()))?;
    if out.extension().is_some_and(|e| e == "parquet") {
        reprobench_analysis::frame::write_parquet(&rows, f)?;
    } else {
        let mut w = std::io::BufWriter::new(f);
        for r in &rows {
            serde_json::to_writer(&mut w, r)?;
            std::io::Write::write_all(&mut w, b"\n")?;
        }
    }
    let resolved = rows.iter().filter(|r| r.success).count();
    eprintln!(
        "imported {} rows ({resolved} resolved) into {}",
        rows.len(),
        out.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every subcommand's flags are consistent (clap checks names, ids and conflicts only when
    /// a subcommand is parsed, so a clash would otherwise show up as a panic at run time).
    #[test]
    fn the_command_line_definition_is_consistent() {
        super::Cli::command().debug_assert();
    }

    fn node_command(args: &[&str]) -> Result<super::NodeArgs, clap::Error> {
        use clap::Parser;
        let base = [
            "reprobench",
            "node",
            "--coordinator",
            "http://x",
            "--token-file",
            "t",
        ];
        match super::Cli::try_parse_from(base.iter().chain(args))?.command {
            super::Command::Node(a) => Ok(a),
            _ => unreachable!("parsed `node`"),
        }
    }

    /// A local node started with `node_args()` gets exactly the parent's settings, flags given
    /// or not; and the typed value does not mix with the flags it stands for.
    #[test]
    fn local_nodes_get_the_settings_of_the_flags_as_one_value() {
        let flags = [
            "--repos",
            "mirrors",
            "--image-budget-gb",
            "3",
            "--sim-latency-scale",
            "0.5",
            "--avd",
            "Pixel",
            "--allow-unisolated-process",
        ];
        for given in [&flags[..], &[]] {
            let parent = node_command(given).unwrap();
            let child_args = parent.swt.node_args();
            let refs: Vec<&str> = child_args.iter().map(String::as_str).collect();
            let child = node_command(&refs).unwrap();
            let json =
                |s: &reprobench_agent_node::runtime::SwtSettings| serde_json::to_value(s).unwrap();
            let got: reprobench_agent_node::runtime::SwtSettings =
                serde_json::from_str(child.settings_json.as_deref().unwrap()).unwrap();
            assert_eq!(json(&got), json(&parent.swt.local_settings()));
        }
        let strict = node_command(&[]).unwrap().swt.settings().code;
        assert!(!strict.agent_commands && !strict.env_commands);
        assert_eq!(strict.key_envs, Some(vec![]));
        let allowing = node_command(&[
            "--allow-agent-commands",
            "--allow-env-commands",
            "--allow-key-env",
            "OPENAI_API_KEY",
            "--allow-http-host",
            "vllm",
        ])
        .unwrap()
        .swt
        .settings()
        .code;
        assert!(allowing.agent_commands && allowing.env_commands);
        assert_eq!(allowing.key_envs, Some(vec!["OPENAI_API_KEY".to_string()]));
        assert_eq!(allowing.http_hosts, ["vllm"]);
        let parent = node_command(&flags).unwrap().swt.settings();
        assert_eq!(parent.docker.disk_budget_bytes, 3 << 30);
        assert!(parent.repos.is_absolute() && parent.repos.ends_with("mirrors"));
        assert!(parent.emulator.is_some() && parent.allow_unisolated_process);
        let mixed = node_command(&["--settings-json", "{}", "--repos", "r"]);
        assert!(
            mixed.is_err(),
            "--settings-json with a flag it stands for must be refused"
        );
    }

    /// `NodeOptions::defaults()` is what no flag gives.
    #[test]
    fn the_node_defaults_are_the_flags_defaults() {
        let d = super::NodeOptions::defaults();
        assert_eq!(d.image_budget_gb, 20);
        assert_eq!(d.base_image, reprobench_sandbox::docker::DEFAULT_BASE_IMAGE);
        assert_eq!(
            d.preassess_replicas,
            reprobench_android::executor::DEFAULT_PREASSESS_REPLICAS
        );
    }
}
