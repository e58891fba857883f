//! The agents' repository tools over a small Python project in a temporary directory.

use reprobench_agents::tools::bm25::{code_chunks, retrieve};
use reprobench_agents::tools::codegraph::{CodeGraph, DefKind};
use reprobench_agents::tools::repo::RepoView;
use reprobench_agents::tools::{ToolBox, ToolError, is_read_only_tool};
use std::fs;
use std::path::Path;

const INIT: &str = "\"\"\"The package.\"\"\"\nfrom .core import Greeter\nfrom . import util\n";

const CORE: &str = r#""""Core module."""
import os
import pkg.util as u
from .util import helper, shout as yell


class Base:
    """A base class."""

    def greet(self):
        return "hi"


class Greeter(Base):
    """Greets people.

    More text.
    """

    def __init__(self, name):
        self.name = name

    @property
    def title(self):
        return helper(self.name)

    def greet(self):
        def decorate(text):
            return yell(text)

        return decorate(self.title) + os.sep


def make_greeter(name):
    return Greeter(name)
"#;

const UTIL: &str = r#"def helper(value):
    """Return value stripped."""
    return value.strip()


def shout(text):
    return text.upper()


DEFAULT = helper("  x ")
"#;

const DEEP: &str = r#"from ..core import make_greeter
from .. import util


def run():
    g = make_greeter("bob")
    return util.helper(g.greet())
"#;

const BROKEN: &str = "def ok():\n    return 1\n\ndef broken(:\n    pass\n";

/// The project under `dir/repo`, with a secret outside it at `dir/outside`.
fn project(dir: &Path) -> std::path::PathBuf {
    let root = dir.join("repo");
    let write = |path: &str, contents: &[u8]| {
        let full = root.join(path);
        fs::create_dir_all(full.parent().unwrap()).unwrap();
        fs::write(full, contents).unwrap();
    };
    write("pkg/__init__.py", INIT.as_bytes());
    write("pkg/core.py", CORE.as_bytes());
    write("pkg/util.py", UTIL.as_bytes());
    write("pkg/sub/__init__.py", b"");
    write("pkg/sub/deep.py", DEEP.as_bytes());
    write("pkg/broken.py", BROKEN.as_bytes());
    write(
        "pkg/latin.py",
        b"# caf\xe9 helper\ndef latin_func():\n    return 'x'\n",
    );
    write("pkg/blob.py", b"\x00\x01def helper(): pass\x00");
    write("data.bin", b"\x00\x01\x02helper\x00");
    write("README.md", b"Use helper to strip.\n");
    write(".git/config", b"helper = 1\n");
    write(".venv/lib/site.py", b"def helper(): pass\n");
    write("myenv/pyvenv.cfg", b"home = /usr/bin\n");
    write("myenv/lib/mod.py", b"def helper(): pass\n");
    write("node_modules/x/index.js", b"helper();\n");
    write("pkg/__pycache__/core.cpython-311.py", b"helper\n");
    let outside = dir.join("outside");
    fs::create_dir_all(&outside).unwrap();
    fs::write(outside.join("secret.txt"), "helper secret\n").unwrap();
    std::os::unix::fs::symlink(outside.join("secret.txt"), root.join("link.txt")).unwrap();
    std::os::unix::fs::symlink(&outside, root.join("linkdir")).unwrap();
    root
}

fn fixture() -> (tempfile::TempDir, RepoView) {
    let dir = tempfile::tempdir().unwrap();
    let root = project(dir.path());
    (dir, RepoView::new(root))
}

#[test]
fn grep_finds_lines_in_text_files_only_sorted_by_path_and_line() {
    let (_dir, repo) = fixture();
    let hits = repo.grep(r"helper\b", None, 100).unwrap();
    let places: Vec<(&str, usize)> = hits
        .iter()
        .map(|hit| (hit.path.as_str(), hit.line))
        .collect();
    assert_eq!(
        places,
        [
            ("README.md", 1),
            ("pkg/core.py", 4),
            ("pkg/core.py", 25),
            ("pkg/latin.py", 1),
            ("pkg/sub/deep.py", 7),
            ("pkg/util.py", 1),
            ("pkg/util.py", 10),
        ]
    );
    assert_eq!(hits[2].text, "        return helper(self.name)");
    assert_eq!(hits[3].text, "# caf\u{fffd} helper");
}

#[test]
fn grep_filters_by_path_glob_and_stops_at_max_hits() {
    let (_dir, repo) = fixture();
    let python = repo.grep("helper", Some("*.py"), 100).unwrap();
    assert!(python.iter().all(|hit| hit.path.ends_with(".py")));
    assert!(!python.is_empty());
    let deep = repo.grep("helper", Some("pkg/sub"), 100).unwrap();
    assert_eq!(deep.len(), 1);
    assert_eq!(deep[0].path, "pkg/sub/deep.py");
    assert_eq!(repo.grep("helper", None, 2).unwrap().len(), 2);
}

#[test]
fn grep_rejects_an_invalid_regex_with_advice() {
    let (_dir, repo) = fixture();
    let error = repo.grep("helper(", None, 10).unwrap_err();
    assert!(matches!(error, ToolError::InvalidRegex { .. }));
    assert!(error.to_string().contains("backslash"), "{error}");
}

#[test]
fn glob_supports_stars_double_stars_and_classes() {
    let (_dir, repo) = fixture();
    let all = repo.glob("**/*.py").unwrap();
    assert_eq!(
        all,
        [
            "pkg/__init__.py",
            "pkg/blob.py",
            "pkg/broken.py",
            "pkg/core.py",
            "pkg/latin.py",
            "pkg/sub/__init__.py",
            "pkg/sub/deep.py",
            "pkg/util.py",
        ]
    );
    assert_eq!(
        repo.glob("pkg/[cu]*.py").unwrap(),
        ["pkg/core.py", "pkg/util.py"]
    );
    assert_eq!(repo.glob("*.md").unwrap(), ["README.md"]);
    assert!(repo.glob("*.py").unwrap().is_empty());
    assert_eq!(repo.python_files(), all);
}

#[test]
fn read_file_numbers_the_requested_range() {
    let (_dir, repo) = fixture();
    let text = repo.read_file("pkg/core.py", Some(14), Some(15)).unwrap();
    assert_eq!(
        text,
        "  14| class Greeter(Base):\n  15|     \"\"\"Greets people.\n"
    );
    let whole = repo.read_file("./pkg/util.py", None, None).unwrap();
    assert!(whole.starts_with("   1| def helper(value):\n"));
    assert!(whole.ends_with("  10| DEFAULT = helper(\"  x \")\n"));
    let error = repo.read_file("pkg/util.py", Some(50), None).unwrap_err();
    assert!(matches!(error, ToolError::LineOutOfRange { lines: 10, .. }));
    let error = repo.read_file("pkg/util.py", Some(5), Some(2)).unwrap_err();
    assert!(matches!(error, ToolError::InvalidRange { .. }));
}

#[test]
fn read_file_refuses_paths_that_leave_the_repository() {
    let (dir, repo) = fixture();
    let absolute = dir.path().join("outside/secret.txt");
    for path in [
        absolute.to_str().unwrap(),
        "../outside/secret.txt",
        "pkg/../../outside/secret.txt",
        "link.txt",
        "linkdir/secret.txt",
    ] {
        let error = repo.read_file(path, None, None).unwrap_err();
        assert!(
            matches!(error, ToolError::PathRefused { .. }),
            "{path}: {error}"
        );
        assert!(
            error
                .to_string()
                .contains("relative to the repository root")
        );
    }
}

#[test]
fn read_file_explains_missing_directories_and_binary_files() {
    let (_dir, repo) = fixture();
    let missing = repo.read_file("pkg/nope.py", None, None).unwrap_err();
    assert!(missing.to_string().contains("**/nope.py"), "{missing}");
    assert!(matches!(
        repo.read_file("pkg", None, None).unwrap_err(),
        ToolError::IsDirectory { .. }
    ));
    assert!(matches!(
        repo.read_file("data.bin", None, None).unwrap_err(),
        ToolError::Binary { .. }
    ));
}

#[test]
fn graph_records_definitions_with_line_ranges_kinds_and_docs() {
    let (_dir, repo) = fixture();
    let graph = CodeGraph::build(&repo);
    let defs: Vec<(&str, DefKind, usize, usize)> = graph
        .definitions_in("pkg/core.py")
        .into_iter()
        .map(|def| {
            (
                def.qualname.as_str(),
                def.kind,
                def.start_line,
                def.end_line,
            )
        })
        .collect();
    assert_eq!(
        defs,
        [
            ("Base", DefKind::Class, 7, 11),
            ("Base.greet", DefKind::Method, 10, 11),
            ("Greeter", DefKind::Class, 14, 31),
            ("Greeter.__init__", DefKind::Method, 20, 21),
            ("Greeter.title", DefKind::Method, 23, 25),
            ("Greeter.greet", DefKind::Method, 27, 31),
            ("Greeter.greet.decorate", DefKind::Function, 28, 29),
            ("make_greeter", DefKind::Function, 34, 35),
        ]
    );
    let greeter = graph.find("Greeter")[0];
    assert_eq!(greeter.signature, "class Greeter(Base):");
    assert_eq!(greeter.doc.as_deref(), Some("Greets people."));
    let helper = graph.find("helper");
    assert_eq!(helper.len(), 1);
    assert_eq!(helper[0].path, "pkg/util.py");
    assert_eq!(helper[0].doc.as_deref(), Some("Return value stripped."));
    assert_eq!(helper[0].signature, "def helper(value):");
}

#[test]
fn find_accepts_names_qualnames_and_module_paths() {
    let (_dir, repo) = fixture();
    let graph = CodeGraph::build(&repo);
    let qualnames = |query: &str| -> Vec<String> {
        graph
            .find(query)
            .into_iter()
            .map(|def| format!("{}:{}", def.path, def.qualname))
            .collect()
    };
    assert_eq!(
        qualnames("greet"),
        ["pkg/core.py:Base.greet", "pkg/core.py:Greeter.greet"]
    );
    assert_eq!(qualnames("Greeter.greet"), ["pkg/core.py:Greeter.greet"]);
    assert_eq!(qualnames("pkg.util.shout"), ["pkg/util.py:shout"]);
    assert_eq!(
        qualnames("decorate"),
        ["pkg/core.py:Greeter.greet.decorate"]
    );
    assert!(qualnames("reet").is_empty());
}

#[test]
fn broken_and_binary_files_are_reported_not_fatal() {
    let (_dir, repo) = fixture();
    let graph = CodeGraph::build(&repo);
    assert_eq!(graph.skipped_files(), ["pkg/blob.py"]);
    assert_eq!(graph.files_with_syntax_errors(), ["pkg/broken.py"]);
    assert_eq!(graph.find("ok")[0].path, "pkg/broken.py");
    assert_eq!(graph.find("latin_func")[0].start_line, 2);
    assert!(!graph.contains_file("pkg/blob.py"));
    assert!(
        !graph
            .files()
            .any(|path| path.contains("venv") || path.contains("pycache"))
    );
}

#[test]
fn enclosing_gives_the_innermost_definition() {
    let (_dir, repo) = fixture();
    let graph = CodeGraph::build(&repo);
    let qualname = |line| {
        graph
            .enclosing("pkg/core.py", line)
            .map(|def| def.qualname.clone())
    };
    assert_eq!(qualname(29).as_deref(), Some("Greeter.greet.decorate"));
    assert_eq!(qualname(31).as_deref(), Some("Greeter.greet"));
    assert_eq!(qualname(23).as_deref(), Some("Greeter.title"));
    assert_eq!(qualname(18).as_deref(), Some("Greeter"));
    assert_eq!(qualname(5), None);
}

#[test]
fn callers_and_callees_follow_calls_across_modules() {
    let (_dir, repo) = fixture();
    let graph = CodeGraph::build(&repo);
    let callers: Vec<(&str, usize, Option<&str>, &str)> = graph
        .callers_of("helper", None)
        .into_iter()
        .map(|call| {
            (
                call.path.as_str(),
                call.line,
                call.caller.as_deref(),
                call.callee.as_str(),
            )
        })
        .collect();
    assert_eq!(
        callers,
        [
            ("pkg/core.py", 25, Some("Greeter.title"), "helper"),
            ("pkg/sub/deep.py", 7, Some("run"), "util.helper"),
            ("pkg/util.py", 10, None, "helper"),
        ]
    );
    let callees: Vec<&str> = graph
        .callees_of("pkg/core.py", "Greeter.greet")
        .into_iter()
        .map(|call| call.callee.as_str())
        .collect();
    assert_eq!(callees, ["decorate"]);
    let callees: Vec<&str> = graph
        .callees_of("pkg/sub/deep.py", "run")
        .into_iter()
        .map(|call| call.callee.as_str())
        .collect();
    assert_eq!(callees, ["make_greeter", "util.helper", "g.greet"]);
    assert_eq!(graph.callers_of("Greeter.greet", None).len(), 1);
}

#[test]
fn imports_are_recorded_and_relative_ones_resolved() {
    let (_dir, repo) = fixture();
    let graph = CodeGraph::build(&repo);
    let imports: Vec<(usize, &str, Vec<&str>, &str)> = graph
        .imports_in("pkg/core.py")
        .into_iter()
        .map(|import| {
            (
                import.line,
                import.module.as_str(),
                import.names.iter().map(String::as_str).collect(),
                import.absolute_module.as_str(),
            )
        })
        .collect();
    assert_eq!(
        imports,
        [
            (2, "os", vec![], "os"),
            (3, "pkg.util", vec![], "pkg.util"),
            (4, ".util", vec!["helper", "shout"], "pkg.util"),
        ]
    );
    let importers = |module: &str| -> Vec<String> {
        graph
            .files_importing(module)
            .into_iter()
            .map(|import| format!("{}:{}", import.path, import.line))
            .collect()
    };
    assert_eq!(
        importers("pkg.util"),
        [
            "pkg/__init__.py:3",
            "pkg/core.py:3",
            "pkg/core.py:4",
            "pkg/sub/deep.py:2"
        ]
    );
    assert_eq!(
        importers("pkg.core"),
        ["pkg/__init__.py:2", "pkg/sub/deep.py:1"]
    );
    assert_eq!(graph.module_of("pkg/sub/deep.py"), Some("pkg.sub.deep"));
}

#[test]
fn outline_indents_nested_definitions() {
    let (_dir, repo) = fixture();
    let graph = CodeGraph::build(&repo);
    assert_eq!(
        graph.outline("pkg/core.py"),
        "class Base:  [7-11]\n\
         \x20   def greet(self):  [10-11]\n\
         class Greeter(Base):  [14-31]\n\
         \x20   def __init__(self, name):  [20-21]\n\
         \x20   def title(self):  [23-25]\n\
         \x20   def greet(self):  [27-31]\n\
         \x20       def decorate(text):  [28-29]\n\
         def make_greeter(name):  [34-35]\n"
    );
    assert!(
        graph
            .outline("pkg/sub/__init__.py")
            .contains("no functions or classes")
    );
    assert!(
        graph
            .outline("nope.py")
            .contains("not a parsed Python file")
    );
}

#[test]
fn chunks_follow_top_level_definitions_and_module_code() {
    let (_dir, repo) = fixture();
    let graph = CodeGraph::build(&repo);
    let chunks = code_chunks(&repo, &graph, 10);
    let core: Vec<(usize, usize)> = chunks
        .iter()
        .filter(|chunk| chunk.path == "pkg/core.py")
        .map(|chunk| (chunk.start_line, chunk.end_line))
        .collect();
    assert_eq!(core, [(1, 4), (7, 11), (14, 23), (24, 31), (34, 35)]);
    let last = chunks
        .iter()
        .find(|chunk| chunk.path == "pkg/core.py" && chunk.start_line == 34);
    assert_eq!(
        last.unwrap().text,
        "def make_greeter(name):\n    return Greeter(name)"
    );
}

#[test]
fn retrieval_ranks_the_defining_chunk_first() {
    let (_dir, repo) = fixture();
    let graph = CodeGraph::build(&repo);
    let found = retrieve(&repo, &graph, "make_greeter crashes on empty names", 3);
    assert_eq!(
        (found[0].path.as_str(), found[0].start_line),
        ("pkg/core.py", 34)
    );
    let found = retrieve(&repo, &graph, "shout should not uppercase", 1);
    assert_eq!(
        (found[0].path.as_str(), found[0].start_line),
        ("pkg/util.py", 6)
    );
}

/// What graph searches add about the fixture's binary `.py` file, which the graph cannot parse.
const BLOB_NOTE: &str = "[1 Python file not in the graph (over 1 MiB, binary or unreadable): pkg/blob.py; read them in parts with read_file]\n";

#[test]
fn toolbox_answers_calls_with_text() {
    let dir = tempfile::tempdir().unwrap();
    let tools = ToolBox::new(project(dir.path()));
    let grep = tools.call(
        "grep",
        r#"{"pattern": "def helper", "path_glob": "pkg/**"}"#,
    );
    assert!(grep.ok, "{}", grep.text);
    assert_eq!(grep.text, "pkg/util.py:1: def helper(value):\n");
    let glob = tools.call("glob", r#"{"pattern": "pkg/sub/*"}"#);
    assert_eq!(glob.text, "pkg/sub/__init__.py\npkg/sub/deep.py\n");
    let read = tools.call(
        "read_file",
        r#"{"path": "pkg/util.py", "start_line": 6, "end_line": "7"}"#,
    );
    assert_eq!(
        read.text,
        "   6| def shout(text):\n   7|     return text.upper()\n"
    );
    let find = tools.call("code_graph", r#"{"op": "find", "name": "helper"}"#);
    assert_eq!(
        find.text,
        format!(
            "pkg/util.py:1-3 function helper\n    def helper(value):\n    \"\"\"Return value stripped.\"\"\"\n{BLOB_NOTE}"
        )
    );
    let enclosing = tools.call(
        "code_graph",
        r#"{"op": "enclosing", "path": "pkg/core.py", "line": 29}"#,
    );
    assert!(
        enclosing
            .text
            .starts_with("pkg/core.py:28-29 function Greeter.greet.decorate")
    );
    let callers = tools.call("code_graph", r#"{"op": "callers", "name": "make_greeter"}"#);
    assert_eq!(
        callers.text.strip_suffix(BLOB_NOTE).unwrap(),
        "1 call site\npkg/sub/deep.py:6 in run: make_greeter(...)\n"
    );
    // Narrowed to a directory, and the closest dotted match first.
    let callers = tools.call(
        "code_graph",
        r#"{"op": "callers", "name": "helper", "path": "pkg/sub"}"#,
    );
    assert_eq!(
        callers.text.strip_suffix(BLOB_NOTE).unwrap(),
        "1 call site\npkg/sub/deep.py:7 in run: util.helper(...)\n"
    );
    let callers = tools.call("code_graph", r#"{"op": "callers", "name": "util.helper"}"#);
    assert!(
        callers
            .text
            .starts_with("3 call sites\npkg/sub/deep.py:7 in run: util.helper(...)\n"),
        "{}",
        callers.text
    );
    let outside = tools.call(
        "code_graph",
        r#"{"op": "callers", "name": "helper", "path": "../outside"}"#,
    );
    assert!(!outside.ok, "{}", outside.text);
    // Imports of a file, and the files importing a module.
    let imports = tools.call("code_graph", r#"{"op": "imports", "path": "pkg/core.py"}"#);
    assert_eq!(
        imports.text.strip_suffix(BLOB_NOTE).unwrap(),
        "pkg/core.py:2: import os\npkg/core.py:3: import pkg.util\npkg/core.py:4: from .util import helper, shout  (module pkg.util)\n"
    );
    let importers = tools.call("code_graph", r#"{"op": "imports", "name": "pkg.util"}"#);
    assert!(
        importers.ok && importers.text.contains("pkg/core.py:3: import pkg.util\n"),
        "{}",
        importers.text
    );
    let callees = tools.call(
        "code_graph",
        r#"{"op": "callees", "path": "pkg/core.py", "name": "Greeter.title"}"#,
    );
    assert_eq!(
        callees.text,
        "pkg/core.py:25 in Greeter.title: helper(...)\n"
    );
    let outline = tools.call("code_graph", r#"{"op": "outline", "path": "pkg/util.py"}"#);
    assert_eq!(
        outline.text,
        "def helper(value):  [1-3]\ndef shout(text):  [6-7]\n"
    );
    assert!(is_read_only_tool("code_graph"));
}

#[test]
fn toolbox_reports_bad_calls_without_panicking() {
    let dir = tempfile::tempdir().unwrap();
    let tools = ToolBox::new(project(dir.path()));
    let cases = [
        ("run_shell", "{}", "unknown tool `run_shell`"),
        ("grep", "{\"pattern\": ", "not valid JSON"),
        ("grep", "[1, 2]", "must be a JSON object, got an array"),
        ("grep", "{}", "missing `pattern`"),
        (
            "grep",
            r#"{"pattern": "x", "max_hits": "many"}"#,
            "`max_hits` must be a positive integer",
        ),
        (
            "grep",
            r#"{"pattern": "x", "max_hits": -3}"#,
            "`max_hits` must be a positive integer",
        ),
        ("grep", r#"{"pattern": "(("}"#, "invalid regex"),
        (
            "glob",
            r#"{"pattern": 7}"#,
            "`pattern` must be a string, got a number",
        ),
        ("read_file", r#"{"path": "../etc/passwd"}"#, "refused path"),
        (
            "read_file",
            r#"{"path": "link.txt"}"#,
            "outside the repository",
        ),
        ("code_graph", r#"{"op": "explode"}"#, "unknown op `explode`"),
        (
            "code_graph",
            r#"{"op": "enclosing", "path": "pkg/core.py"}"#,
            "missing `line`",
        ),
        (
            "code_graph",
            r#"{"op": "callees", "path": "pkg/core.py", "name": "greet"}"#,
            "defines no `greet`",
        ),
        (
            "code_graph",
            r#"{"op": "outline", "path": "README.md"}"#,
            ".py files only",
        ),
        ("code_graph", r#"{"op": "find"}"#, "missing `name`"),
    ];
    for (tool, arguments, expected) in cases {
        let output = tools.call(tool, arguments);
        assert!(
            !output.ok,
            "{tool} {arguments} should fail: {}",
            output.text
        );
        assert!(
            output.text.contains(expected),
            "{tool} {arguments}: {}",
            output.text
        );
    }
    let missing = tools.call("grep", "{}");
    assert!(
        missing.text.contains(r#"{"pattern": "<regex>""#),
        "{}",
        missing.text
    );
    let nothing = tools.call("grep", r#"{"pattern": "no_such_thing_anywhere"}"#);
    assert!(nothing.ok);
    assert!(nothing.text.starts_with("no lines match"));
}

#[test]
fn toolbox_caps_long_output_with_a_way_to_read_on() {
    let dir = tempfile::tempdir().unwrap();
    let root = project(dir.path());
    let big: String = (1..=1000)
        .map(|n| format!("value_{n} = '{}'\n", "x".repeat(60)))
        .collect();
    fs::write(root.join("big.py"), big).unwrap();
    let tools = ToolBox::new(root);
    let read = tools.call("read_file", r#"{"path": "big.py"}"#);
    assert!(read.ok);
    assert!(read.text.chars().count() <= 8000);
    assert!(
        read.text.contains("call read_file with start_line="),
        "{}",
        read.text
    );
    let grep = tools.call("grep", r#"{"pattern": "value_", "max_hits": 500}"#);
    assert!(grep.text.chars().count() <= 8000);
    assert!(grep.text.contains("narrow the pattern"));
    let few = tools.call("grep", r#"{"pattern": "value_", "max_hits": 3}"#);
    assert_eq!(few.text.lines().count(), 4, "{}", few.text);
    assert!(few.text.contains("stopped at 3 hits"));
}

/// Files the tools cannot take whole are named in their answers, never skipped in silence.
#[test]
fn files_over_the_size_limit_are_reported_by_grep_and_the_code_graph() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("repo");
    fs::create_dir_all(root.join("pkg")).unwrap();
    let mut big = String::from("def helper_big():\n    return 1\n");
    while big.len() <= 1 << 20 {
        big.push_str("# padding padding padding padding padding padding padding padding\n");
    }
    fs::write(root.join("pkg/big.py"), big).unwrap();
    fs::write(
        root.join("pkg/small.py"),
        "from pkg.big import helper_big\n\nhelper_big()\n",
    )
    .unwrap();
    let tools = ToolBox::new(root);
    let grep = tools.call("grep", r#"{"pattern": "def helper_big"}"#);
    assert!(grep.ok, "{}", grep.text);
    assert!(grep.text.starts_with("no lines match"), "{}", grep.text);
    assert!(grep.text.contains("pkg/big.py"), "{}", grep.text);
    let grep = tools.call("grep", r#"{"pattern": "helper_big\\(\\)"}"#);
    assert!(
        grep.text.starts_with("pkg/small.py:3: helper_big()\n"),
        "{}",
        grep.text
    );
    assert!(
        grep.text
            .contains("1 file over 1 MiB not searched: pkg/big.py"),
        "{}",
        grep.text
    );
    let find = tools.call("code_graph", r#"{"op": "find", "name": "helper_big"}"#);
    assert!(find.text.contains("pkg/big.py"), "{}", find.text);
    // An answer about one parsed file says nothing of the others.
    let outline = tools.call("code_graph", r#"{"op": "outline", "path": "pkg/small.py"}"#);
    assert!(!outline.text.contains("pkg/big.py"), "{}", outline.text);
}

/// Toolboxes of one commit share one code graph, built once even when asked for at once;
/// another commit has its own.
#[test]
fn toolboxes_of_one_commit_share_one_graph() {
    let dir = tempfile::tempdir().unwrap();
    let root = project(dir.path());
    let boxes: Vec<std::sync::Arc<ToolBox>> = (0..4)
        .map(|_| std::sync::Arc::new(ToolBox::shared(&root, "example/pkg", "c0ffee")))
        .collect();
    let graphs: Vec<usize> = std::thread::scope(|scope| {
        let handles: Vec<_> = boxes
            .iter()
            .map(|b| scope.spawn(|| b.graph() as *const CodeGraph as usize))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(graphs.iter().all(|g| *g == graphs[0]), "{graphs:?}");
    assert!(boxes[0].graph().find("helper").len() == 1);
    let other = ToolBox::shared(&root, "example/pkg", "decade");
    assert_ne!(other.graph() as *const CodeGraph as usize, graphs[0]);
    let own = ToolBox::new(&root);
    assert_ne!(own.graph() as *const CodeGraph as usize, graphs[0]);
}

/// Whole-file screening finds what a line-by-line search finds: anchors at line ends, CRLF
/// files, and a pattern spanning lines (never a match, as in a line-by-line search).
#[test]
fn grep_matches_lines_as_a_line_by_line_search_does() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("repo");
    fs::create_dir_all(&root).unwrap();
    fs::write(root.join("unix.py"), "x = 1\nimport os\nend = 2\n").unwrap();
    fs::write(root.join("dos.py"), "y = 1\r\nimport sys\r\nend = 3\r\n").unwrap();
    let repo = RepoView::new(&root);
    let found = |pattern: &str| -> Vec<(String, usize)> {
        repo.grep(pattern, None, 100)
            .unwrap()
            .into_iter()
            .map(|h| (h.path, h.line))
            .collect()
    };
    assert_eq!(
        found("^import"),
        [("dos.py".into(), 2), ("unix.py".into(), 2)]
    );
    assert_eq!(found(r"sys$"), [("dos.py".to_string(), 2)]);
    assert_eq!(
        found(r"^end = \d$"),
        [("dos.py".into(), 3), ("unix.py".into(), 3)]
    );
    assert!(found(r"1\nimport").is_empty());
    assert!(found(r"os\s+end").is_empty());
}

/// The walk is the files on disk: hidden files and directories (but `.git`), and files an
/// ignore file names, are walked; the skipped directories, virtual environments and symlinks
/// are not.
#[test]
fn the_walk_reads_no_ignore_file_and_skips_the_listed_directories() {
    let dir = tempfile::tempdir().unwrap();
    let root = project(dir.path());
    let write = |path: &str, contents: &str| {
        let full = root.join(path);
        fs::create_dir_all(full.parent().unwrap()).unwrap();
        fs::write(full, contents).unwrap();
    };
    write(".gitignore", "pkg/generated.py\n*.log\n");
    write(".ignore", "README.md\n");
    write(".github/workflows/ci.yml", "run: helper\n");
    write("pkg/generated.py", "def helper(): pass\n");
    write("build.log", "helper\n");
    let repo = RepoView::new(&root);
    assert_eq!(
        repo.glob("**/*").unwrap(),
        [
            ".github/workflows/ci.yml",
            ".gitignore",
            ".ignore",
            "README.md",
            "build.log",
            "data.bin",
            "pkg/__init__.py",
            "pkg/blob.py",
            "pkg/broken.py",
            "pkg/core.py",
            "pkg/generated.py",
            "pkg/latin.py",
            "pkg/sub/__init__.py",
            "pkg/sub/deep.py",
            "pkg/util.py",
        ]
    );
    let paths: Vec<String> = repo
        .grep("helper", None, 100)
        .unwrap()
        .into_iter()
        .map(|hit| hit.path)
        .collect();
    for path in [".github/workflows/ci.yml", "build.log", "pkg/generated.py"] {
        assert!(paths.iter().any(|p| p == path), "{path} in {paths:?}");
    }
}

/// What grep answered before it used grep-searcher: each file read whole (skipped when over
/// 1 MiB or with a NUL byte in its first 8 KiB), decoded with invalid UTF-8 replaced, split
/// with `lines()`, each line searched alone.
fn line_by_line_grep(root: &Path, paths: &[String], pattern: &str) -> Vec<(String, usize, String)> {
    let regex = regex::Regex::new(pattern).unwrap();
    let mut hits = Vec::new();
    for path in paths {
        let bytes = fs::read(root.join(path)).unwrap();
        if bytes.len() > 1 << 20 || bytes.iter().take(8192).any(|&b| b == 0) {
            continue;
        }
        let text = String::from_utf8_lossy(&bytes);
        for (index, line) in text.lines().enumerate() {
            if regex.is_match(line) {
                hits.push((path.clone(), index + 1, line.trim_end().to_string()));
            }
        }
    }
    hits
}

/// grep finds the lines a line-by-line search finds, in files with CRLF and bare CR line ends,
/// invalid UTF-8, a BOM, blank lines, no final newline or a NUL byte, with patterns using
/// anchors, `\A`/`\z`, literal line ends and character classes; and stops at the same hit.
#[test]
fn grep_answers_as_the_line_by_line_search_did() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("repo");
    let files: Vec<(&str, Vec<u8>)> = vec![
        ("unix.py", b"x = 1\nimport os\nend = 2\n\n".to_vec()),
        ("dos.py", b"y = 1\r\nimport sys\r\nend = 3\r\n".to_vec()),
        ("mac.txt", b"import a\rimport b\rend\r".to_vec()),
        (
            "mixed.txt",
            b"tab\tsep\r\nbare\rcr here\nimport x \nlast line$".to_vec(),
        ),
        (
            "latin.py",
            b"caf\xe9 = 1\n# caf\xe9 helper\nimport ok\n".to_vec(),
        ),
        ("bom.py", "\u{feff}import os\nx = 1\n".as_bytes().to_vec()),
        ("empty.py", Vec::new()),
        ("blank.txt", b"\n\n\n".to_vec()),
        (
            "uni.py",
            "naïve = 'ü'\nΣ = 1\nimport ünï\n".as_bytes().to_vec(),
        ),
        ("early_nul.txt", b"import early\n\x00\n".to_vec()),
        (
            "utf16.txt",
            [0xff, 0xfe]
                .into_iter()
                .chain("import u16\n".encode_utf16().flat_map(u16::to_le_bytes))
                .collect(),
        ),
        ("late_nul.txt", {
            let mut late = "# padding line\n".repeat(600).into_bytes();
            late.extend_from_slice(b"nul \x00 here\nimport late\n");
            late
        }),
        ("sub/deeper.py", b"import os\nimport sys".to_vec()),
    ];
    for (path, bytes) in &files {
        let full = root.join(path);
        fs::create_dir_all(full.parent().unwrap()).unwrap();
        fs::write(full, bytes).unwrap();
    }
    let repo = RepoView::new(&root);
    let paths = repo.glob("**/*").unwrap();
    assert_eq!(paths.len(), files.len());
    let patterns = [
        "^import",
        r"import \w+$",
        "sys$",
        "^$",
        "^",
        "$",
        "x*",
        "caf.",
        r"caf\W",
        r"\Aimport",
        r"end\z",
        r"^end\z",
        r"1\nimport",
        r"nomatch\n|import",
        r"\r",
        r"bare\rcr",
        r"cr\s",
        r"\s$",
        r"x \z",
        "(?-m)^import",
        "(?m)^end",
        r"\bos\b",
        "(?i)IMPORT",
        ".",
        "[^a-z]",
        r"\p{Greek}",
        "ü",
        "line[$]",
        r"\x00",
        "import late",
        "import early",
        "u16",
        r"\Bort",
    ];
    for pattern in patterns {
        let expected = line_by_line_grep(&root, &paths, pattern);
        let got: Vec<(String, usize, String)> = repo
            .grep(pattern, None, 1000)
            .unwrap()
            .into_iter()
            .map(|hit| (hit.path, hit.line, hit.text))
            .collect();
        assert_eq!(got, expected, "pattern {pattern:?}");
        let first_three = repo.grep(pattern, None, 3).unwrap();
        assert_eq!(
            first_three.len(),
            expected.len().min(3),
            "pattern {pattern:?}"
        );
    }
    assert!(!line_by_line_grep(&root, &paths, "import late").is_empty());
}
