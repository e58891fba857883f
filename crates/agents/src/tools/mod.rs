//! Repository tools for agents: grep, glob, ranged reads, a Python code graph, BM25 retrieval.
//!
//! [`ToolBox`] answers OpenAI-style tool calls (a name and JSON arguments) with text for the
//! model; the typed functions behind it live in [`repo`], [`codegraph`] and [`bm25`].

pub mod bm25;
pub mod codegraph;
pub mod repo;

use codegraph::{CallSite, CodeGraph, Definition, Import};
use repo::{MAX_GLOB_RESULTS, RepoView, normalize_relative};
use serde::Serialize;
use serde_json::{Map, Value, json};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

/// Longest text one tool call returns, in characters.
pub const MAX_OUTPUT_CHARS: usize = 8000;
/// Hits `grep` returns when the call does not say.
pub const DEFAULT_GREP_HITS: usize = 50;
/// Most hits one `grep` call may ask for.
pub const MAX_GREP_HITS: usize = 500;

/// Why a tool call or a typed tool function gave no answer; the text tells the model what to
/// do instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolError {
    /// The grep pattern is not a valid regex.
    #[error(
        "invalid regex `{pattern}`: {message}; escape special characters such as `(`, `[`, `.` \
         or `*` with a backslash to match them literally"
    )]
    InvalidRegex { pattern: String, message: String },
    /// The glob pattern cannot be parsed.
    #[error("invalid glob `{pattern}`: {reason}")]
    InvalidGlob { pattern: String, reason: String },
    /// The path may not be read.
    #[error(
        "refused path `{path}`: {reason}; give a path relative to the repository root that \
         stays inside it, e.g. `pkg/module.py`"
    )]
    PathRefused { path: String, reason: String },
    /// Nothing exists at the path.
    #[error("no file `{path}` in the repository; use glob (e.g. `**/{}`) to find it", file_name(.path))]
    NotFound { path: String },
    /// The path is a directory.
    #[error("`{path}` is a directory; use glob with `{path}/*` to list it")]
    IsDirectory { path: String },
    /// The file is binary.
    #[error("`{path}` is a binary file and cannot be shown as text")]
    Binary { path: String },
    /// The file is too large to read.
    #[error(
        "`{path}` has {bytes} bytes, more than the 1 MiB limit; use grep with path_glob=`{path}` to find the lines you need"
    )]
    TooLarge { path: String, bytes: u64 },
    /// The first requested line is past the end of the file.
    #[error("`{path}` has only {lines} lines; start_line {start} is past the end")]
    LineOutOfRange {
        path: String,
        start: usize,
        lines: usize,
    },
    /// The requested range ends before it starts.
    #[error("end_line {end} is before start_line {start}; give start_line <= end_line")]
    InvalidRange { start: usize, end: usize },
    /// Reading failed.
    #[error("could not read `{path}`: {message}")]
    Io { path: String, message: String },
    /// The call's arguments are not valid JSON.
    #[error("{tool}: arguments are not valid JSON ({message}); expected {usage}")]
    ArgumentsNotJson {
        tool: String,
        message: String,
        usage: &'static str,
    },
    /// The call's arguments are valid JSON but not an object.
    #[error("{tool}: arguments must be a JSON object, got {kind}; expected {usage}")]
    ArgumentsNotObject {
        tool: String,
        kind: &'static str,
        usage: &'static str,
    },
    /// A required argument is absent.
    #[error("{tool}: missing `{field}`; expected {usage}")]
    MissingArgument {
        tool: String,
        field: String,
        usage: &'static str,
    },
    /// A required string argument is blank.
    #[error("{tool}: `{field}` is empty; expected {usage}")]
    EmptyArgument {
        tool: String,
        field: String,
        usage: &'static str,
    },
    /// An argument has the wrong JSON type or an unusable value.
    #[error("{tool}: `{field}` must be {wanted}, got {kind}; expected {usage}")]
    InvalidArgument {
        tool: String,
        field: String,
        wanted: &'static str,
        kind: &'static str,
        usage: &'static str,
    },
    /// `code_graph` was asked for an operation it does not have.
    #[error(
        "code_graph: unknown op `{op}`; op must be one of find, outline, callers, \
         callees, enclosing, imports; expected {usage}"
    )]
    UnknownGraphOp { op: String, usage: &'static str },
    /// The file defines nothing with the qualname.
    #[error(
        "`{path}` defines no `{qualname}`; name must be a qualname such as \
         `Class.method` (see code_graph op=outline for {path})"
    )]
    UnknownDefinition { path: String, qualname: String },
    /// The path is not a Python file the code graph parsed.
    #[error("`{path}` is not a parsed Python file; {}", not_parsed_hint(.path))]
    NotParsedPython { path: String },
}

fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// What to do about a path the code graph has not parsed.
fn not_parsed_hint(path: &str) -> &'static str {
    if path.ends_with(".py") {
        "use glob (e.g. `**/*.py`) to find the right path"
    } else {
        "the code graph covers .py files only"
    }
}

/// The text answer to one tool call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ToolOutput {
    /// Whether the call did what was asked (false: `text` says what went wrong).
    pub ok: bool,
    /// What the model reads.
    pub text: String,
}

impl ToolOutput {
    fn success(text: String) -> ToolOutput {
        ToolOutput { ok: true, text }
    }

    fn failure(text: impl Into<String>) -> ToolOutput {
        ToolOutput {
            ok: false,
            text: text.into(),
        }
    }
}

/// The repository tools over one checkout; the code graph is built on first use, once per
/// (repository, commit) in this process when the toolbox has a [`ToolBox::shared`] key.
#[derive(Debug)]
pub struct ToolBox {
    repo: RepoView,
    graph: OnceLock<Arc<CodeGraph>>,
    /// The key of the shared graph (`repository@commit`), if any.
    shared_key: Option<String>,
}

/// Code graphs of recently used commits kept alive beyond the tasks using them (variants and
/// repeats of one instance follow one another).
pub const GRAPHS_KEPT: usize = 4;

/// The process's code graphs by key: each built once (concurrent askers wait for the one
/// build) and shared read-only.
#[derive(Default)]
struct GraphCache {
    /// Most recently used last.
    entries: Vec<(String, Arc<OnceLock<Arc<CodeGraph>>>)>,
}

static GRAPHS: Mutex<GraphCache> = Mutex::new(GraphCache {
    entries: Vec::new(),
});

/// How many code graphs this process has built (for tests and benchmarks of the sharing).
static GRAPH_BUILDS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// How many code graphs this process has built so far.
pub fn graph_builds() -> usize {
    GRAPH_BUILDS.load(std::sync::atomic::Ordering::SeqCst)
}

fn build_counted(repo: &RepoView) -> Arc<CodeGraph> {
    GRAPH_BUILDS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    Arc::new(CodeGraph::build(repo))
}

/// The shared graph of `key`, built from `repo` if no task has built it yet.
fn shared_graph(key: &str, repo: &RepoView) -> Arc<CodeGraph> {
    let cell = {
        let mut cache = GRAPHS.lock().unwrap_or_else(|e| e.into_inner());
        let cell = match cache.entries.iter().position(|(k, _)| k == key) {
            Some(i) => cache.entries.remove(i).1,
            None => Arc::new(OnceLock::new()),
        };
        cache.entries.push((key.to_string(), cell.clone()));
        if cache.entries.len() > GRAPHS_KEPT {
            cache.entries.remove(0);
        }
        cell
    };
    // Outside the cache's lock: other keys are served while this one builds.
    cell.get_or_init(|| build_counted(repo)).clone()
}

/// Names of the tools [`ToolBox::call`] accepts.
pub const TOOL_NAMES: [&str; 4] = ["grep", "glob", "read_file", "code_graph"];

/// Whether the tool `name` only reads the repository (every [`ToolBox`] tool does; anything
/// else is not known to).
pub fn is_read_only_tool(name: &str) -> bool {
    TOOL_NAMES.contains(&name)
}

/// OpenAI function-calling specs of the [`ToolBox`] tools.
pub fn tool_specs() -> Vec<Value> {
    let function = |name: &str, description: &str, parameters: Value| {
        json!({
            "type": "function",
            "function": {"name": name, "description": description, "parameters": parameters}
        })
    };
    vec![
        function(
            "grep",
            "Search the repository's text files for lines matching a regular expression (Rust \
             regex syntax). Returns `path:line: text`, sorted by path then line. Skips .git, \
             virtualenvs, caches, binary files and files over 1 MiB.",
            json!({
                "type": "object",
                "properties": {
                    "pattern": {"type": "string", "description": "Regular expression, e.g. `def parse_\\w+` or `class Foo\\b`."},
                    "path_glob": {"type": "string", "description": "Only search files whose path matches this glob, e.g. `**/*.py`, `src/pkg/**`; a pattern without `/` matches file names anywhere (`*.py`), and a directory path matches everything below it."},
                    "max_hits": {"type": "integer", "minimum": 1, "maximum": MAX_GREP_HITS, "description": format!("Most hits to return (default {DEFAULT_GREP_HITS}).")}
                },
                "required": ["pattern"],
                "additionalProperties": false
            }),
        ),
        function(
            "glob",
            "List repository files whose relative path matches a glob: `*` and `?` match within \
             one path segment, `**` matches any number of directories, `[abc]` one of the \
             characters. Example: `**/test_*.py`.",
            json!({
                "type": "object",
                "properties": {
                    "pattern": {"type": "string", "description": "Glob relative to the repository root, e.g. `src/**/*.py`."}
                },
                "required": ["pattern"],
                "additionalProperties": false
            }),
        ),
        function(
            "read_file",
            "Read a file's lines, numbered `  12| text`, at most 400 lines per call. Paths are \
             relative to the repository root.",
            json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "File path relative to the repository root, e.g. `pkg/module.py`."},
                    "start_line": {"type": "integer", "minimum": 1, "description": "First line to show (1-based, default 1)."},
                    "end_line": {"type": "integer", "minimum": 1, "description": "Last line to show, inclusive (default: end of file, capped at 400 lines)."}
                },
                "required": ["path"],
                "additionalProperties": false
            }),
        ),
        function(
            "code_graph",
            "Query the Python code graph. op=find (name): definitions named `name`, \
             `Class.method` or `pkg.module.func`; op=outline (path): the classes and functions \
             of a file with line ranges; op=callers (name, optional path): call sites of \
             functions or methods with that name, closest dotted matches first, only in that file \
             or directory if a path is given; op=callees (path, name = qualname like \
             `Class.method`): calls made inside that definition; op=enclosing (path, line): the \
             innermost function or class containing the line; op=imports (path): what a file \
             imports, or (name = a dotted module) the files that import that module.",
            json!({
                "type": "object",
                "properties": {
                    "op": {"type": "string", "enum": ["find", "outline", "callers", "callees", "enclosing", "imports"]},
                    "name": {"type": "string", "description": "A name or dotted qualname (find, callers, callees), or a dotted module (imports)."},
                    "path": {"type": "string", "description": "A .py file relative to the repository root (outline, callees, enclosing, imports), or a file or directory narrowing callers."},
                    "line": {"type": "integer", "minimum": 1, "description": "A 1-based line number (enclosing)."}
                },
                "required": ["op"],
                "additionalProperties": false
            }),
        ),
    ]
}

impl ToolBox {
    /// Tools over the checkout at `root`.
    pub fn new(root: impl Into<PathBuf>) -> ToolBox {
        ToolBox {
            repo: RepoView::new(root),
            graph: OnceLock::new(),
            shared_key: None,
        }
    }

    /// Tools over a checkout of `commit` of `repository` that nothing writes to: every toolbox
    /// of the same commit in this process shares one code graph (a commit id names its tree).
    pub fn shared(root: impl Into<PathBuf>, repository: &str, commit: &str) -> ToolBox {
        ToolBox {
            shared_key: Some(format!("{repository}@{commit}")),
            ..ToolBox::new(root)
        }
    }

    /// The checkout view.
    pub fn repo(&self) -> &RepoView {
        &self.repo
    }

    /// The code graph, built on the first call.
    pub fn graph(&self) -> &CodeGraph {
        self.graph.get_or_init(|| match &self.shared_key {
            Some(key) => shared_graph(key, &self.repo),
            None => build_counted(&self.repo),
        })
    }

    /// Runs the tool `name` with `arguments` (a JSON object as the model wrote it). Bad input
    /// gives `ok = false` and text naming the problem and the expected arguments; text longer
    /// than [`MAX_OUTPUT_CHARS`] is cut with a note on how to narrow the call.
    pub fn call(&self, name: &str, arguments: &str) -> ToolOutput {
        let Some(usage) = usage_of(name) else {
            return ToolOutput::failure(format!(
                "unknown tool `{name}`; the tools are: {}",
                TOOL_NAMES.join(", ")
            ));
        };
        let arguments = match parse_arguments(name, usage, arguments) {
            Ok(arguments) => arguments,
            Err(error) => return ToolOutput::failure(error.to_string()),
        };
        let args = Args {
            map: &arguments,
            usage,
            tool: name,
        };
        let result = match name {
            "grep" => self.call_grep(&args),
            "glob" => self.call_glob(&args),
            "read_file" => self.call_read_file(&args),
            _ => self.call_code_graph(&args),
        };
        match result {
            Ok(text) => ToolOutput::success(cap_output(name, text)),
            Err(error) => ToolOutput::failure(cap_output(name, error.to_string())),
        }
    }

    fn call_grep(&self, args: &Args) -> Result<String, ToolError> {
        let pattern = args.required_str("pattern")?;
        let path_glob = args.optional_str("path_glob")?;
        let max_hits = args
            .optional_usize("max_hits")?
            .unwrap_or(DEFAULT_GREP_HITS)
            .clamp(1, MAX_GREP_HITS);
        let (hits, too_large) = self
            .repo
            .grep_reporting_skips(pattern, path_glob, max_hits + 1)?;
        // Never a silent skip: the agent learns which files were not searched.
        let skipped = skipped_note(
            &too_large,
            "file",
            "over 1 MiB not searched",
            "read parts of them with read_file",
        );
        if hits.is_empty() {
            let scope =
                path_glob.map_or(String::new(), |glob| format!(" in files matching `{glob}`"));
            let mut none = format!("no lines match `{pattern}`{scope}");
            if !skipped.is_empty() {
                none.push('\n');
                none.push_str(&skipped);
            }
            return Ok(none);
        }
        let mut out: String = hits
            .iter()
            .take(max_hits)
            .map(|hit| format!("{}:{}: {}\n", hit.path, hit.line, hit.text))
            .collect();
        if hits.len() > max_hits {
            out.push_str(&format!(
                "[stopped at {max_hits} hits; narrow the pattern or path_glob, or raise max_hits (at most {MAX_GREP_HITS})]\n"
            ));
        }
        out.push_str(&skipped);
        Ok(out)
    }

    fn call_glob(&self, args: &Args) -> Result<String, ToolError> {
        let pattern = args.required_str("pattern")?;
        let paths = self.repo.glob(pattern)?;
        if paths.is_empty() {
            let hint = if pattern.contains('/') || pattern.starts_with("**") {
                ""
            } else {
                "; `*` does not cross directories, try `**/"
            };
            let hint = if hint.is_empty() {
                String::new()
            } else {
                format!("{hint}{pattern}`")
            };
            return Ok(format!("no files match `{pattern}`{hint}"));
        }
        let mut out = paths.join("\n");
        out.push('\n');
        if paths.len() >= MAX_GLOB_RESULTS {
            out.push_str(&format!(
                "[stopped at {MAX_GLOB_RESULTS} paths; use a narrower pattern]\n"
            ));
        }
        Ok(out)
    }

    fn call_read_file(&self, args: &Args) -> Result<String, ToolError> {
        let path = normalize_relative(args.required_str("path")?);
        let start_line = args.optional_usize("start_line")?;
        let end_line = args.optional_usize("end_line")?;
        self.repo.read_file(&path, start_line, end_line)
    }

    fn call_code_graph(&self, args: &Args) -> Result<String, ToolError> {
        let op = args.required_str("op")?;
        let mut answer = self.graph_answer(op, args)?;
        // Never a silent skip: searches over the whole graph say which files it lacks.
        let skipped = self.graph().skipped_files();
        if matches!(op, "find" | "callers" | "imports") && !skipped.is_empty() {
            if !answer.ends_with('\n') {
                answer.push('\n');
            }
            answer.push_str(&skipped_note(
                skipped,
                "Python file",
                "not in the graph (over 1 MiB, binary or unreadable)",
                "read them in parts with read_file",
            ));
        }
        Ok(answer)
    }

    fn graph_answer(&self, op: &str, args: &Args) -> Result<String, ToolError> {
        let graph = self.graph();
        match op {
            "find" => {
                let name = args.required_str("name")?;
                let found = graph.find(name);
                if found.is_empty() {
                    return Ok(format!(
                        "no function, method or class named `{name}`; try grep for the name"
                    ));
                }
                Ok(found.into_iter().map(describe_definition).collect())
            }
            "outline" => {
                let path = self.graph_path(args)?;
                Ok(graph.outline(&path))
            }
            "callers" => {
                let name = args.required_str("name")?;
                let within = args.optional_str("path")?.map(normalize_relative);
                if let Some(within) = &within {
                    repo::checked_relative_path(within)?;
                }
                let calls = graph.callers_of(name, within.as_deref());
                if calls.is_empty() {
                    let place = within.map(|w| format!(" in {w}")).unwrap_or_default();
                    return Ok(format!(
                        "no calls of `{name}` found{place}; try grep for the name"
                    ));
                }
                let total = calls.len();
                let mut out = match total {
                    1 => "1 call site\n".to_string(),
                    n => format!("{n} call sites\n"),
                };
                out.extend(calls.into_iter().map(describe_call));
                Ok(out)
            }
            "imports" => match (args.optional_str("path")?, args.optional_str("name")?) {
                (Some(_), _) => {
                    let path = self.graph_path(args)?;
                    let imports = graph.imports_in(&path);
                    if imports.is_empty() {
                        return Ok(format!("{path} imports nothing"));
                    }
                    Ok(imports.into_iter().map(describe_import).collect())
                }
                (None, Some(module)) => {
                    let imports = graph.files_importing(module);
                    if imports.is_empty() {
                        return Ok(format!(
                            "no file imports `{module}`; give a dotted module such as `pkg.sub`"
                        ));
                    }
                    Ok(imports.into_iter().map(describe_import).collect())
                }
                (None, None) => Err(args.missing("path")),
            },
            "callees" => {
                let path = self.graph_path(args)?;
                let qualname = args.required_str("name")?;
                if !graph
                    .definitions_in(&path)
                    .iter()
                    .any(|def| def.qualname == qualname)
                {
                    return Err(ToolError::UnknownDefinition {
                        path,
                        qualname: qualname.to_string(),
                    });
                }
                let calls = graph.callees_of(&path, qualname);
                if calls.is_empty() {
                    return Ok(format!("`{qualname}` in {path} makes no calls"));
                }
                Ok(calls.into_iter().map(describe_call).collect())
            }
            "enclosing" => {
                let path = self.graph_path(args)?;
                let line = args
                    .optional_usize("line")?
                    .ok_or_else(|| args.missing("line"))?;
                match graph.enclosing(&path, line) {
                    Some(def) => Ok(describe_definition(def)),
                    None => Ok(format!(
                        "line {line} of {path} is module-level code, in no function or class"
                    )),
                }
            }
            other => Err(ToolError::UnknownGraphOp {
                op: other.to_string(),
                usage: args.usage,
            }),
        }
    }

    /// The `path` argument, checked to be a parsed Python file.
    fn graph_path(&self, args: &Args) -> Result<String, ToolError> {
        let path = normalize_relative(args.required_str("path")?);
        if self.graph().contains_file(&path) {
            return Ok(path);
        }
        repo::checked_relative_path(&path)?;
        Err(ToolError::NotParsedPython { path })
    }
}

/// `path:start-end kind qualname`, the signature and the docstring's first line.
fn describe_definition(def: &Definition) -> String {
    let mut out = format!(
        "{}:{}-{} {} {}\n    {}\n",
        def.path,
        def.start_line,
        def.end_line,
        def.kind.as_str(),
        def.qualname,
        def.signature
    );
    if let Some(doc) = &def.doc {
        out.push_str(&format!("    \"\"\"{doc}\"\"\"\n"));
    }
    out
}

/// `[N NOUNs WHY: a, b, …; HINT]` naming at most ten of `paths`; empty when there are none.
fn skipped_note(paths: &[String], noun: &str, why: &str, hint: &str) -> String {
    let n = paths.len();
    if n == 0 {
        return String::new();
    }
    let named = paths
        .iter()
        .take(10)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    let more = if n > 10 { ", …" } else { "" };
    let plural = if n == 1 { "" } else { "s" };
    format!("[{n} {noun}{plural} {why}: {named}{more}; {hint}]\n")
}

/// `path:line: from module import names` (with the absolute module when it differs).
fn describe_import(import: &Import) -> String {
    let statement = if import.names.is_empty() {
        format!("import {}", import.module)
    } else {
        format!("from {} import {}", import.module, import.names.join(", "))
    };
    if import.absolute_module != import.module {
        format!(
            "{}:{}: {statement}  (module {})\n",
            import.path, import.line, import.absolute_module
        )
    } else {
        format!("{}:{}: {statement}\n", import.path, import.line)
    }
}

/// `path:line in caller: callee(...)`.
fn describe_call(call: &CallSite) -> String {
    let caller = call.caller.as_deref().unwrap_or("<module>");
    format!(
        "{}:{} in {}: {}(...)\n",
        call.path, call.line, caller, call.callee
    )
}

/// How each tool is called, for error messages.
fn usage_of(tool: &str) -> Option<&'static str> {
    Some(match tool {
        "grep" => {
            r#"{"pattern": "<regex>", "path_glob": "<glob, optional>", "max_hits": <integer, optional>}"#
        }
        "glob" => r#"{"pattern": "<glob such as **/*.py>"}"#,
        "read_file" => {
            r#"{"path": "<relative path>", "start_line": <integer, optional>, "end_line": <integer, optional>}"#
        }
        "code_graph" => {
            r#"{"op": "find|outline|callers|callees|enclosing|imports", "name": "<name, for find/callers/callees; a module, for imports>", "path": "<.py path, for outline/callees/enclosing/imports; a file or directory narrowing callers>", "line": <integer, for enclosing>}"#
        }
        _ => return None,
    })
}

/// The arguments of a call of `tool` (called as `usage`) as a JSON object; an empty string
/// counts as `{}`.
fn parse_arguments(
    tool: &str,
    usage: &'static str,
    arguments: &str,
) -> Result<Map<String, Value>, ToolError> {
    if arguments.trim().is_empty() {
        return Ok(Map::new());
    }
    match serde_json::from_str::<Value>(arguments) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(other) => Err(ToolError::ArgumentsNotObject {
            tool: tool.to_string(),
            kind: json_kind(&other),
            usage,
        }),
        Err(error) => Err(ToolError::ArgumentsNotJson {
            tool: tool.to_string(),
            message: error.to_string(),
            usage,
        }),
    }
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// One call's arguments with the typed getters the tools use.
struct Args<'a> {
    map: &'a Map<String, Value>,
    usage: &'static str,
    tool: &'a str,
}

impl Args<'_> {
    fn missing(&self, field: &str) -> ToolError {
        ToolError::MissingArgument {
            tool: self.tool.to_string(),
            field: field.to_string(),
            usage: self.usage,
        }
    }

    fn invalid(&self, field: &str, wanted: &'static str, value: &Value) -> ToolError {
        ToolError::InvalidArgument {
            tool: self.tool.to_string(),
            field: field.to_string(),
            wanted,
            kind: json_kind(value),
            usage: self.usage,
        }
    }

    fn required_str(&self, field: &str) -> Result<&str, ToolError> {
        match self.optional_str(field)? {
            Some(value) if !value.trim().is_empty() => Ok(value),
            Some(_) => Err(ToolError::EmptyArgument {
                tool: self.tool.to_string(),
                field: field.to_string(),
                usage: self.usage,
            }),
            None => Err(self.missing(field)),
        }
    }

    fn optional_str(&self, field: &str) -> Result<Option<&str>, ToolError> {
        match self.map.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(value)) => Ok(Some(value)),
            Some(other) => Err(self.invalid(field, "a string", other)),
        }
    }

    /// A positive integer, also accepted written as a string (`"12"`).
    fn optional_usize(&self, field: &str) -> Result<Option<usize>, ToolError> {
        let value = match self.map.get(field) {
            None | Some(Value::Null) => return Ok(None),
            Some(value) => value,
        };
        let number = match value {
            Value::Number(number) => number.as_u64(),
            Value::String(text) => text.trim().parse::<u64>().ok(),
            _ => None,
        };
        match number.and_then(|number| usize::try_from(number).ok()) {
            Some(number) if number >= 1 => Ok(Some(number)),
            _ => Err(self.invalid(field, "a positive integer", value)),
        }
    }
}

/// `text` cut to at most [`MAX_OUTPUT_CHARS`] characters at a line end, with a note on how to
/// see the rest.
fn cap_output(tool: &str, text: String) -> String {
    if text.chars().count() <= MAX_OUTPUT_CHARS {
        return text;
    }
    let byte_limit = text
        .char_indices()
        .nth(MAX_OUTPUT_CHARS - 300)
        .map_or(text.len(), |(byte, _)| byte);
    let cut = text[..byte_limit]
        .rfind('\n')
        .map_or(byte_limit, |newline| newline + 1);
    let kept = &text[..cut];
    let note = match tool {
        "read_file" => match last_numbered_line(kept) {
            Some(line) => format!(
                "[output cut at {MAX_OUTPUT_CHARS} characters; call read_file with \
                 start_line={} to read on, or ask for a smaller range]\n",
                line + 1
            ),
            None => format!(
                "[output cut at {MAX_OUTPUT_CHARS} characters; ask for a smaller line range]\n"
            ),
        },
        "grep" => format!(
            "[output cut at {MAX_OUTPUT_CHARS} characters; narrow the pattern, add a path_glob \
             or lower max_hits]\n"
        ),
        "glob" => {
            format!("[output cut at {MAX_OUTPUT_CHARS} characters; use a narrower pattern]\n")
        }
        _ => format!(
            "[output cut at {MAX_OUTPUT_CHARS} characters; ask about a more specific name or path]\n"
        ),
    };
    format!("{kept}{note}")
}

/// The number of the last `  12| text` line in `text`.
fn last_numbered_line(text: &str) -> Option<usize> {
    text.lines()
        .rev()
        .find_map(|line| line.split_once('|')?.0.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_read_output_is_cut_at_a_line_with_a_read_on_note() {
        let text: String = (1..=400)
            .map(|n| format!("{n:>4}| {}\n", "x".repeat(40)))
            .collect();
        let capped = cap_output("read_file", text);
        assert!(capped.chars().count() <= MAX_OUTPUT_CHARS);
        let shown = last_numbered_line(&capped).unwrap();
        assert!(
            capped.contains(&format!("start_line={}", shown + 1)),
            "{capped}"
        );
        let before_note = capped.rsplit_once('[').unwrap().0;
        assert!(before_note.ends_with('\n'));
    }

    #[test]
    fn short_output_is_left_alone() {
        assert_eq!(cap_output("grep", "a:1: x\n".to_string()), "a:1: x\n");
    }

    /// The texts the model reads for bad calls, word for word (they end up in prompts,
    /// transcripts and replay hashes).
    #[test]
    fn bad_calls_are_answered_with_the_exact_texts() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("pkg")).unwrap();
        std::fs::write(dir.path().join("pkg/m.py"), "def f():\n    pass\n").unwrap();
        std::fs::write(dir.path().join("README.md"), "hello\n").unwrap();
        let tools = ToolBox::new(dir.path());
        let grep_usage = r#"{"pattern": "<regex>", "path_glob": "<glob, optional>", "max_hits": <integer, optional>}"#;
        let graph_usage = r#"{"op": "find|outline|callers|callees|enclosing|imports", "name": "<name, for find/callers/callees; a module, for imports>", "path": "<.py path, for outline/callees/enclosing/imports; a file or directory narrowing callers>", "line": <integer, for enclosing>}"#;
        let json_error = serde_json::from_str::<Value>("{").unwrap_err();
        let cases = [
            (
                "grep",
                "{".to_string(),
                format!("grep: arguments are not valid JSON ({json_error}); expected {grep_usage}"),
            ),
            (
                "grep",
                "[1]".to_string(),
                format!("grep: arguments must be a JSON object, got an array; expected {grep_usage}"),
            ),
            (
                "grep",
                "{}".to_string(),
                format!("grep: missing `pattern`; expected {grep_usage}"),
            ),
            (
                "grep",
                r#"{"pattern": " "}"#.to_string(),
                format!("grep: `pattern` is empty; expected {grep_usage}"),
            ),
            (
                "grep",
                r#"{"pattern": 7}"#.to_string(),
                format!("grep: `pattern` must be a string, got a number; expected {grep_usage}"),
            ),
            (
                "grep",
                r#"{"pattern": "x", "max_hits": 0}"#.to_string(),
                format!(
                    "grep: `max_hits` must be a positive integer, got a number; expected {grep_usage}"
                ),
            ),
            (
                "code_graph",
                r#"{"op": "explode"}"#.to_string(),
                format!(
                    "code_graph: unknown op `explode`; op must be one of find, outline, callers, callees, enclosing, imports; expected {graph_usage}"
                ),
            ),
            (
                "code_graph",
                r#"{"op": "enclosing", "path": "pkg/m.py"}"#.to_string(),
                format!("code_graph: missing `line`; expected {graph_usage}"),
            ),
            (
                "code_graph",
                r#"{"op": "callees", "path": "pkg/m.py", "name": "g"}"#.to_string(),
                "`pkg/m.py` defines no `g`; name must be a qualname such as `Class.method` (see code_graph op=outline for pkg/m.py)".to_string(),
            ),
            (
                "code_graph",
                r#"{"op": "outline", "path": "pkg/other.py"}"#.to_string(),
                "`pkg/other.py` is not a parsed Python file; use glob (e.g. `**/*.py`) to find the right path".to_string(),
            ),
            (
                "code_graph",
                r#"{"op": "outline", "path": "README.md"}"#.to_string(),
                "`README.md` is not a parsed Python file; the code graph covers .py files only"
                    .to_string(),
            ),
        ];
        for (tool, arguments, expected) in cases {
            let output = tools.call(tool, &arguments);
            assert!(!output.ok, "{tool} {arguments}");
            assert_eq!(output.text, expected, "{tool} {arguments}");
        }
    }

    #[test]
    fn specs_name_every_tool_with_an_object_schema() {
        let specs = tool_specs();
        let names: Vec<&str> = specs
            .iter()
            .map(|spec| spec["function"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, TOOL_NAMES);
        for spec in &specs {
            assert_eq!(spec["type"], "function");
            assert_eq!(spec["function"]["parameters"]["type"], "object");
            assert!(spec["function"]["parameters"]["required"].is_array());
        }
        assert!(is_read_only_tool("grep"));
        assert!(!is_read_only_tool("run_test"));
    }
}
