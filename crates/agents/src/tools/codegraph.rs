//! A Python code graph built with tree-sitter: definitions, call sites and imports of every
//! `.py` file in a checkout, with queries an agent can ask about them.

use super::repo::RepoView;
use std::collections::{BTreeMap, BTreeSet};
use tree_sitter::{Node, Parser};

/// What kind of thing a [`Definition`] defines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DefKind {
    /// A function at module level or nested in another function.
    Function,
    /// A class.
    Class,
    /// A function defined directly in a class body.
    Method,
}

impl DefKind {
    /// The lowercase name of the kind.
    pub fn as_str(self) -> &'static str {
        match self {
            DefKind::Function => "function",
            DefKind::Class => "class",
            DefKind::Method => "method",
        }
    }
}

/// A function, method or class definition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Definition {
    /// File path relative to the root, `/`-separated.
    pub path: String,
    /// The defined name.
    pub name: String,
    /// Dotted name within the module: `Class.method`, `outer.inner`.
    pub qualname: String,
    /// Function, class or method.
    pub kind: DefKind,
    /// First line (1-based), decorators included.
    pub start_line: usize,
    /// Last line (1-based, inclusive).
    pub end_line: usize,
    /// The `def`/`class` header, on one line.
    pub signature: String,
    /// First line of the docstring, if any.
    pub doc: Option<String>,
}

/// A call expression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallSite {
    /// File path relative to the root.
    pub path: String,
    /// 1-based line of the call.
    pub line: usize,
    /// Qualname of the innermost enclosing definition; `None` at module level.
    pub caller: Option<String>,
    /// The called expression as written: `foo`, `self.bar`, `mod.baz`.
    pub callee: String,
}

/// One imported module of an `import` or `from … import` statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Import {
    /// File path relative to the root.
    pub path: String,
    /// 1-based line of the statement.
    pub line: usize,
    /// The module as written: `a.b`, `.sibling`, `..`.
    pub module: String,
    /// Names imported from the module (`from x import y as z` gives `y`; `*` for a wildcard);
    /// empty for a plain `import`.
    pub names: Vec<String>,
    /// The module made absolute: relative imports resolved against the file's package.
    pub absolute_module: String,
}

/// Definitions, call sites and imports of a checkout's Python files.
#[derive(Debug, Clone, Default)]
pub struct CodeGraph {
    files: BTreeMap<String, FileFacts>,
    skipped: Vec<String>,
    with_syntax_errors: Vec<String>,
}

#[derive(Debug, Clone, Default)]
struct FileFacts {
    module: String,
    definitions: Vec<Definition>,
    calls: Vec<CallSite>,
    imports: Vec<Import>,
}

impl CodeGraph {
    /// Parses every `.py` file of `repo`. Files that cannot be read (binary, too large) or
    /// parsed are skipped and listed in [`CodeGraph::skipped_files`]; files with syntax errors
    /// keep what tree-sitter recovered and are listed in [`CodeGraph::files_with_syntax_errors`].
    pub fn build(repo: &RepoView) -> CodeGraph {
        let paths = repo.python_files();
        let package_dirs: BTreeSet<String> = paths
            .iter()
            .filter_map(|path| path.strip_suffix("/__init__.py"))
            .map(str::to_string)
            .collect();
        let mut parser = Parser::new();
        let mut graph = CodeGraph::default();
        if parser
            .set_language(&tree_sitter_python::LANGUAGE.into())
            .is_err()
        {
            graph.skipped = paths;
            return graph;
        }
        for path in paths {
            let Ok(source) = repo.read_text(&path) else {
                graph.skipped.push(path);
                continue;
            };
            let Some(tree) = parser.parse(&source, None) else {
                graph.skipped.push(path);
                continue;
            };
            if tree.root_node().has_error() {
                graph.with_syntax_errors.push(path.clone());
            }
            let module = module_name(&path, &package_dirs);
            let mut collector = Collector {
                source: source.as_bytes(),
                path: &path,
                package: package_of(&path, &module),
                facts: FileFacts {
                    module,
                    ..FileFacts::default()
                },
            };
            collector.visit(tree.root_node(), &mut Vec::new());
            let mut facts = collector.facts;
            facts
                .definitions
                .sort_by_key(|def| (def.start_line, def.end_line));
            graph.files.insert(path, facts);
        }
        graph
    }

    /// Paths of the parsed files, sorted.
    pub fn files(&self) -> impl Iterator<Item = &str> {
        self.files.keys().map(String::as_str)
    }

    /// Whether `path` is one of the parsed files.
    pub fn contains_file(&self, path: &str) -> bool {
        self.files.contains_key(path)
    }

    /// Python files that could not be read or parsed.
    pub fn skipped_files(&self) -> &[String] {
        &self.skipped
    }

    /// Parsed files whose syntax tree has errors (their facts are partial).
    pub fn files_with_syntax_errors(&self) -> &[String] {
        &self.with_syntax_errors
    }

    /// The dotted module name of a parsed file (`pkg.sub.mod`, `pkg` for `pkg/__init__.py`).
    pub fn module_of(&self, path: &str) -> Option<&str> {
        self.files.get(path).map(|facts| facts.module.as_str())
    }

    /// Definitions whose name is `name`, or whose dotted name (`module.qualname`) equals or ends
    /// with `.name` — so `save`, `Model.save` and `pkg.models.Model.save` all work.
    pub fn find(&self, name: &str) -> Vec<&Definition> {
        let name = name.trim();
        let suffix = format!(".{name}");
        self.files
            .values()
            .flat_map(|facts| {
                let suffix = suffix.as_str();
                facts.definitions.iter().filter(move |def| {
                    def.name == name
                        || def.qualname == name
                        || def.qualname.ends_with(suffix)
                        || format!("{}.{}", facts.module, def.qualname) == name
                        || format!("{}.{}", facts.module, def.qualname).ends_with(suffix)
                })
            })
            .collect()
    }

    /// The definitions in the file at `path`, by start line.
    pub fn definitions_in(&self, path: &str) -> Vec<&Definition> {
        self.files
            .get(path)
            .map(|facts| facts.definitions.iter().collect())
            .unwrap_or_default()
    }

    /// The innermost definition in `path` spanning `line`.
    pub fn enclosing(&self, path: &str, line: usize) -> Option<&Definition> {
        self.files
            .get(path)?
            .definitions
            .iter()
            .filter(|def| def.start_line <= line && line <= def.end_line)
            .min_by_key(|def| def.end_line - def.start_line)
    }

    /// Call sites whose callee's last dotted component is the last component of `name`, in files
    /// at or below `within` (a file or a directory; `None`: everywhere). Those whose callee
    /// ends with more of a dotted `name` (`Class.method` called as `Class.method(...)` or
    /// `obj.method` for `method`) come first, then by path and line.
    pub fn callers_of(&self, name: &str, within: Option<&str>) -> Vec<&CallSite> {
        let name = name.trim();
        let wanted = last_component(name);
        let within = within.map(|w| w.trim_end_matches('/'));
        let inside = |path: &str| match within {
            None | Some("") | Some(".") => true,
            Some(w) => path == w || path.strip_prefix(w).is_some_and(|r| r.starts_with('/')),
        };
        let mut calls: Vec<&CallSite> = self
            .files
            .iter()
            .filter(|(path, _)| inside(path))
            .flat_map(|(_, facts)| facts.calls.iter())
            .filter(|call| last_component(&call.callee) == wanted)
            .collect();
        // How many trailing dotted parts of `name` the callee shares.
        let shared = |callee: &str| {
            name.rsplit('.')
                .zip(callee.rsplit('.'))
                .take_while(|(a, b)| a == b)
                .count()
        };
        calls.sort_by(|a, b| {
            shared(&b.callee)
                .cmp(&shared(&a.callee))
                .then_with(|| a.path.cmp(&b.path))
                .then_with(|| a.line.cmp(&b.line))
        });
        calls
    }

    /// Call sites directly inside the definition `qualname` of `path` (not in nested definitions).
    pub fn callees_of(&self, path: &str, qualname: &str) -> Vec<&CallSite> {
        self.files
            .get(path)
            .map(|facts| {
                facts
                    .calls
                    .iter()
                    .filter(|call| call.caller.as_deref() == Some(qualname))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The imports of the file at `path`, in source order.
    pub fn imports_in(&self, path: &str) -> Vec<&Import> {
        self.files
            .get(path)
            .map(|facts| facts.imports.iter().collect())
            .unwrap_or_default()
    }

    /// Imports of `module`, of a submodule of it, or of `module` as a name from its parent
    /// (`from pkg import mod` imports `pkg.mod`); relative imports count once resolved.
    pub fn files_importing(&self, module: &str) -> Vec<&Import> {
        let module = module.trim();
        let below = format!("{module}.");
        self.files
            .values()
            .flat_map(|facts| facts.imports.iter())
            .filter(|import| {
                let absolute = import.absolute_module.as_str();
                import.module == module
                    || absolute == module
                    || absolute.starts_with(&below)
                    || import
                        .names
                        .iter()
                        .any(|name| format!("{absolute}.{name}") == module)
            })
            .collect()
    }

    /// The definitions of `path` as lines `signature  [start-end]`, nested ones indented under
    /// their parents (or a sentence saying there are none, or that `path` was not parsed).
    pub fn outline(&self, path: &str) -> String {
        let Some(facts) = self.files.get(path) else {
            return format!(
                "{path} is not a parsed Python file; use glob (e.g. `**/*.py`) to find the right path\n"
            );
        };
        if facts.definitions.is_empty() {
            return format!("{path}: no functions or classes\n");
        }
        let mut out = String::new();
        for def in &facts.definitions {
            let depth = def.qualname.matches('.').count();
            out.push_str(&format!(
                "{}{}  [{}-{}]\n",
                "    ".repeat(depth),
                def.signature,
                def.start_line,
                def.end_line
            ));
        }
        out
    }
}

/// Walks one file's syntax tree, collecting its facts.
struct Collector<'a> {
    source: &'a [u8],
    path: &'a str,
    package: String,
    facts: FileFacts,
}

/// A definition being visited: its qualname and kind.
type Scope = (String, DefKind);

impl Collector<'_> {
    fn visit(&mut self, node: Node, scopes: &mut Vec<Scope>) {
        match node.kind() {
            "function_definition" | "class_definition" => {
                if let Some(scope) = self.record_definition(node, scopes) {
                    scopes.push(scope);
                    self.visit_children(node, scopes);
                    scopes.pop();
                    return;
                }
            }
            "call" => self.record_call(node, scopes),
            "import_statement" => self.record_import(node),
            "import_from_statement" | "future_import_statement" => self.record_from_import(node),
            _ => {}
        }
        self.visit_children(node, scopes);
    }

    fn visit_children(&mut self, node: Node, scopes: &mut Vec<Scope>) {
        let mut cursor = node.walk();
        for child in node.named_children(&mut cursor) {
            self.visit(child, scopes);
        }
    }

    fn text(&self, node: Node) -> &str {
        node.utf8_text(self.source).unwrap_or("")
    }

    fn record_definition(&mut self, node: Node, scopes: &[Scope]) -> Option<Scope> {
        let name = self.text(node.child_by_field_name("name")?).to_string();
        let is_class = node.kind() == "class_definition";
        let kind = match (is_class, scopes.last()) {
            (true, _) => DefKind::Class,
            (false, Some((_, DefKind::Class))) => DefKind::Method,
            (false, _) => DefKind::Function,
        };
        let qualname = match scopes.last() {
            Some((parent, _)) => format!("{parent}.{name}"),
            None => name.clone(),
        };
        let outer = match node.parent() {
            Some(parent) if parent.kind() == "decorated_definition" => parent,
            _ => node,
        };
        let body = node.child_by_field_name("body");
        let header_end = body.map_or(node.end_byte(), |body| body.start_byte());
        let header = String::from_utf8_lossy(&self.source[node.start_byte()..header_end]);
        self.facts.definitions.push(Definition {
            path: self.path.to_string(),
            name,
            qualname: qualname.clone(),
            kind,
            start_line: outer.start_position().row + 1,
            end_line: node.end_position().row + 1,
            signature: one_line_header(&header),
            doc: body.and_then(|body| self.docstring(body)),
        });
        Some((qualname, kind))
    }

    fn docstring(&self, body: Node) -> Option<String> {
        let mut cursor = body.walk();
        let first = body.named_children(&mut cursor).next()?;
        if first.kind() != "expression_statement" {
            return None;
        }
        let string = first.named_child(0)?;
        if string.kind() != "string" {
            return None;
        }
        let mut inner = string.walk();
        let content: String = string
            .named_children(&mut inner)
            .filter(|part| part.kind() == "string_content")
            .map(|part| self.text(part))
            .collect();
        content
            .lines()
            .map(str::trim)
            .find(|line| !line.is_empty())
            .map(str::to_string)
    }

    fn record_call(&mut self, node: Node, scopes: &[Scope]) {
        let Some(function) = node.child_by_field_name("function") else {
            return;
        };
        let written: String = self.text(function).split_whitespace().collect();
        let callee = if written.chars().count() > 80 {
            match function.child_by_field_name("attribute") {
                Some(attribute) => format!("….{}", self.text(attribute)),
                None => written.chars().take(80).collect(),
            }
        } else {
            written
        };
        self.facts.calls.push(CallSite {
            path: self.path.to_string(),
            line: node.start_position().row + 1,
            caller: scopes.last().map(|(qualname, _)| qualname.clone()),
            callee,
        });
    }

    fn record_import(&mut self, node: Node) {
        let mut cursor = node.walk();
        let modules: Vec<String> = node
            .children_by_field_name("name", &mut cursor)
            .filter_map(|name| match name.kind() {
                "aliased_import" => name.child_by_field_name("name"),
                _ => Some(name),
            })
            .map(|name| self.text(name).to_string())
            .collect();
        for module in modules {
            self.facts.imports.push(Import {
                path: self.path.to_string(),
                line: node.start_position().row + 1,
                absolute_module: module.clone(),
                module,
                names: Vec::new(),
            });
        }
    }

    fn record_from_import(&mut self, node: Node) {
        let module = match node.child_by_field_name("module_name") {
            Some(module) => self.text(module).split_whitespace().collect::<String>(),
            None => "__future__".to_string(),
        };
        let mut cursor = node.walk();
        let mut names: Vec<String> = node
            .children_by_field_name("name", &mut cursor)
            .filter_map(|name| match name.kind() {
                "aliased_import" => name.child_by_field_name("name"),
                _ => Some(name),
            })
            .map(|name| self.text(name).to_string())
            .collect();
        let mut cursor = node.walk();
        if node
            .named_children(&mut cursor)
            .any(|child| child.kind() == "wildcard_import")
        {
            names.push("*".to_string());
        }
        self.facts.imports.push(Import {
            path: self.path.to_string(),
            line: node.start_position().row + 1,
            absolute_module: resolve_relative(&module, &self.package),
            module,
            names,
        });
    }
}

/// The dotted module name of `path`: its directories that are packages (have `__init__.py`),
/// counted up from the file, then the file's stem (dropped for `__init__.py`).
fn module_name(path: &str, package_dirs: &BTreeSet<String>) -> String {
    let stem = path.strip_suffix(".py").unwrap_or(path);
    let mut parts: Vec<&str> = stem.split('/').collect();
    let file = parts.pop().unwrap_or("");
    let mut package_start = parts.len();
    while package_start > 0 && package_dirs.contains(&parts[..package_start].join("/")) {
        package_start -= 1;
    }
    let mut names: Vec<&str> = parts[package_start..].to_vec();
    if file != "__init__" {
        names.push(file);
    }
    names.join(".")
}

/// The package a module's relative imports start from.
fn package_of(path: &str, module: &str) -> String {
    if path.ends_with("__init__.py") {
        module.to_string()
    } else {
        module
            .rsplit_once('.')
            .map(|(package, _)| package.to_string())
            .unwrap_or_default()
    }
}

/// `module` (possibly relative, like `..x.y`) made absolute against `package`.
fn resolve_relative(module: &str, package: &str) -> String {
    let dots = module.chars().take_while(|&c| c == '.').count();
    if dots == 0 {
        return module.to_string();
    }
    let rest = &module[dots..];
    let mut parts: Vec<&str> = package.split('.').filter(|part| !part.is_empty()).collect();
    for _ in 1..dots {
        parts.pop();
    }
    if !rest.is_empty() {
        parts.push(rest);
    }
    parts.join(".")
}

/// A possibly multi-line `def`/`class` header on one line, without the trailing `:` spacing.
fn one_line_header(header: &str) -> String {
    let joined = header
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    let tidy = joined
        .replace("( ", "(")
        .replace(", )", ")")
        .replace(" )", ")");
    let tidy = tidy.trim_end().to_string();
    if tidy.chars().count() > 300 {
        let mut short: String = tidy.chars().take(300).collect();
        short.push('…');
        short
    } else {
        tidy
    }
}

fn last_component(name: &str) -> &str {
    name.rsplit('.').next().unwrap_or(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_names_follow_package_directories() {
        let packages: BTreeSet<String> = ["src/pkg", "src/pkg/sub"]
            .iter()
            .map(|dir| dir.to_string())
            .collect();
        assert_eq!(module_name("src/pkg/sub/mod.py", &packages), "pkg.sub.mod");
        assert_eq!(module_name("src/pkg/__init__.py", &packages), "pkg");
        assert_eq!(module_name("setup.py", &packages), "setup");
        assert_eq!(module_name("scripts/run.py", &packages), "run");
    }

    #[test]
    fn relative_modules_resolve_against_the_package() {
        assert_eq!(resolve_relative(".util", "pkg.sub"), "pkg.sub.util");
        assert_eq!(resolve_relative("..", "pkg.sub"), "pkg");
        assert_eq!(resolve_relative("..core", "pkg.sub"), "pkg.core");
        assert_eq!(resolve_relative("os.path", "pkg"), "os.path");
    }

    #[test]
    fn multi_line_headers_become_one_line() {
        let header = "def f(\n    a,\n    b=1,\n) -> int:\n    ";
        assert_eq!(one_line_header(header), "def f(a, b=1) -> int:");
    }
}
