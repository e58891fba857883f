//! SWT-bench's "custom diff", the answer format of its ZeroShotPlus baseline, and SWT-bench's
//! conversion of such an answer into a git patch.
//!
//! Source: logic-star-ai/swt-bench at 330a649 (unchanged since its first commit): the format is
//! `PLUS_PROMPT` in `dataset/swt_bench.py`; the conversion is `extract_custom_patches` and
//! `apply_custom_patches` in `src/auxillary_src/extract_patches.py`. SWT-bench applies the
//! blocks to Python ASTs and writes each file it touched back with `ast.unparse`; here the same
//! operations work on lines, so the rest of a file keeps its text (formatting, comments):
//! - a block starts at every line that starts with `diff`; the next three lines are the file,
//!   the mode and the position; the code runs to the next line starting with `end diff` (without
//!   one, to the answer's last line, which is left out, as SWT-bench's loop leaves it);
//! - blocks are applied in the order of their positions sorted as strings (`"10" < "9" < "BOF"
//!   < "EOF"`), file by file in the order files first appear in that order; each block's code
//!   is `textwrap.dedent`ed;
//! - `rewrite`: the code's first statement must be a `def` or `class` (not `async def`); it
//!   replaces every outermost `def` (or `class`) of that name at any depth, decorators included,
//!   indented where that one stood; statements after the first are dropped;
//! - `insert`: the code is appended at the end of the file, whatever the position says (SWT-bench
//!   extends the module's body: BOF and line numbers only order the blocks);
//! - any other mode changes nothing; a file that does not exist is empty (a new file);
//! - a file or block that does not parse, a rewrite of a name the file does not define, or a
//!   rewrite whose first statement is no definition fails: SWT-bench stops there, files finished
//!   before keep their changes, that file and later ones get none;
//! - a rewrite whose code holds no statement, or a file that cannot be read as text, ends the
//!   conversion with no patch at all (SWT-bench's script raises there).
//!
//! Python's parser is approximated: brackets and strings must close, no character Python never
//! accepts outside strings and comments (`` ` ``, `$`, `?`, `!` not before `=`), and indentation
//! must be consistent (no unexpected indent, an indented block after every `:`, dedents to an
//! outer level, decorators before a definition).

use reprobench_swt::grading::pytext::splitlines;
use reprobench_swt::patch;
use serde::Serialize;
use std::collections::BTreeMap;

/// One block of a custom diff.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Block {
    /// The file, as the block names it (relative to the repository root).
    pub file: String,
    /// `rewrite` or `insert` (another word is read, checked to parse, and ignored).
    pub mode: String,
    /// The rough line number, `BOF` or `EOF`: it only orders the blocks.
    pub position: String,
    /// The code's lines.
    pub code: Vec<String>,
}

/// The blocks of a model's answer, as `extract_custom_patches` reads them (the whole answer,
/// fences and prose included: only lines starting with `diff` and `end diff` delimit blocks).
pub fn parse(answer: &str) -> Vec<Block> {
    let lines = splitlines(answer.trim_start_matches('\n'));
    let mut blocks = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if !line.starts_with("diff") {
            continue;
        }
        let (Some(file), Some(mode), Some(position)) =
            (lines.get(i + 1), lines.get(i + 2), lines.get(i + 3))
        else {
            continue;
        };
        let start = i + 4;
        let code = if start >= lines.len() {
            &[][..]
        } else {
            // Python's `for j in range(...)` leaves j at the last index when nothing breaks.
            let end = (start..lines.len())
                .find(|&j| lines[j].starts_with("end diff"))
                .unwrap_or(lines.len() - 1);
            &lines[start..end]
        };
        blocks.push(Block {
            file: file.to_string(),
            mode: mode.to_string(),
            position: position.to_string(),
            code: code.iter().map(|l| l.to_string()).collect(),
        });
    }
    blocks
}

/// Whether an answer's blocks are a custom diff: one of them at least is a `rewrite` or an
/// `insert` (a unified diff's `diff --git` lines make blocks too, with other words as modes).
pub fn is_custom_diff(blocks: &[Block]) -> bool {
    blocks
        .iter()
        .any(|b| b.mode == "rewrite" || b.mode == "insert")
}

/// The repository paths the blocks name that a patch can hold (what the conversion reads).
pub fn paths(blocks: &[Block]) -> Vec<String> {
    let mut out: Vec<String> = blocks.iter().filter_map(|b| repo_path(&b.file)).collect();
    out.sort();
    out.dedup();
    out
}

/// `name` as a path inside the repository (`./` and empty parts dropped); `None` when it is
/// absolute, climbs out with `..`, or holds whitespace, control characters, quotes or
/// backslashes (SWT-bench would write such a file outside the repository or under a name a
/// patch cannot carry here).
pub fn repo_path(name: &str) -> Option<String> {
    if name.starts_with('/')
        || name
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == '"' || c == '\\')
    {
        return None;
    }
    let mut parts = Vec::new();
    for part in name.split('/') {
        match part {
            "" | "." => {}
            ".." => return None,
            p => parts.push(p),
        }
    }
    (!parts.is_empty()).then(|| parts.join("/"))
}

/// What converting a custom diff gave.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Conversion {
    /// The git patch of the files the blocks changed; `None` when they changed none.
    pub patch: Option<String>,
    /// What failed or was left out, in the order the blocks were applied.
    pub notes: Vec<String>,
}

/// How applying one block can go wrong.
enum Failure {
    /// SWT-bench stops at this file (its `apply_custom_patches` returns False).
    Stop(String),
    /// SWT-bench's script raises: no patch at all.
    Raise(String),
}

/// The git patch SWT-bench makes of `blocks`; `file_at(path)` is the file's text at the base
/// commit (`Ok(None)`: no such file; `Err`: it cannot be read as text), asked for the paths
/// [`paths`] lists.
pub fn convert(
    blocks: &[Block],
    file_at: impl Fn(&str) -> Result<Option<String>, String>,
) -> Conversion {
    let mut notes = Vec::new();
    if blocks.is_empty() {
        notes.push("the answer has no custom diff block".to_string());
        return Conversion { patch: None, notes };
    }
    let mut order: Vec<&Block> = blocks.iter().collect();
    order.sort_by(|a, b| a.position.cmp(&b.position));
    let mut files: Vec<&str> = Vec::new();
    for b in &order {
        if !files.contains(&b.file.as_str()) {
            files.push(&b.file);
        }
    }
    // Each file's text at the base commit and now, by repository path (or by the block's name
    // when it is none, so that such files are applied but never enter the patch).
    let mut state: BTreeMap<(bool, String), (Option<String>, String)> = BTreeMap::new();
    'files: for file in files {
        let path = repo_path(file);
        let key = (
            path.is_some(),
            path.clone().unwrap_or_else(|| file.to_string()),
        );
        let (base, mut text) = match state.get(&key) {
            Some((base, now)) => (base.clone(), now.clone()),
            None => {
                let base = match &path {
                    Some(p) => match file_at(p) {
                        Ok(base) => base,
                        Err(why) => {
                            notes.push(format!(
                                "`{file}` cannot be read ({why}): SWT-bench's conversion raises, so there is no patch"
                            ));
                            return Conversion { patch: None, notes };
                        }
                    },
                    None => None,
                };
                let text = base.clone().unwrap_or_default();
                (base, text)
            }
        };
        if let Some(why) = scan(&lines_of(&text)).error {
            notes.push(format!(
                "`{file}` does not parse as Python ({why}): SWT-bench stops at this file"
            ));
            break;
        }
        for block in order.iter().filter(|b| b.file == file) {
            let code = dedent(&block.code.join("\n"));
            let applied = match scan(&code.split('\n').collect::<Vec<_>>()).error {
                Some(why) => Err(Failure::Stop(format!("its code does not parse ({why})"))),
                None => match block.mode.as_str() {
                    "rewrite" => rewrite(&text, &code),
                    "insert" => Ok(insert(&text, &code)),
                    other => {
                        notes.push(format!(
                            "a block of `{file}` has mode `{other}`, neither `rewrite` nor `insert`: it changes nothing"
                        ));
                        Ok(text.clone())
                    }
                },
            };
            match applied {
                Ok(new) => text = new,
                Err(Failure::Stop(why)) => {
                    notes.push(format!(
                        "the `{}` block of `{file}` at `{}` fails: {why}; SWT-bench stops at this file",
                        block.mode, block.position
                    ));
                    break 'files;
                }
                Err(Failure::Raise(why)) => {
                    notes.push(format!(
                        "the `{}` block of `{file}` at `{}`: {why}; SWT-bench's conversion raises, so there is no patch",
                        block.mode, block.position
                    ));
                    return Conversion { patch: None, notes };
                }
            }
        }
        state.insert(key, (base, text));
    }
    let mut patch = String::new();
    for ((representable, path), (base, text)) in &state {
        if base.as_deref() == Some(text.as_str()) || (base.is_none() && text.is_empty()) {
            continue;
        }
        if !*representable {
            notes.push(format!(
                "`{path}` is not a path inside the repository: its changes are left out"
            ));
            continue;
        }
        match base {
            Some(base) => patch.push_str(&unified_diff(path, base, text)),
            None => patch.push_str(&patch::new_file_diff(path, text)),
        }
    }
    Conversion {
        patch: (!patch.is_empty()).then_some(patch),
        notes,
    }
}

/// `textwrap.dedent`: lines of only spaces and tabs become empty, and the leading whitespace
/// that all other lines share is removed from each.
pub fn dedent(text: &str) -> String {
    let lines: Vec<&str> = text
        .split('\n')
        .map(|l| {
            if l.trim_matches([' ', '\t']).is_empty() {
                ""
            } else {
                l
            }
        })
        .collect();
    let mut margin: Option<&str> = None;
    for l in lines.iter().filter(|l| !l.is_empty()) {
        let indent = &l[..l.len() - l.trim_start_matches([' ', '\t']).len()];
        margin = Some(match margin {
            None => indent,
            Some(m) => {
                let common = m
                    .bytes()
                    .zip(indent.bytes())
                    .take_while(|(a, b)| a == b)
                    .count();
                &m[..common]
            }
        });
    }
    let margin = margin.unwrap_or("");
    lines
        .iter()
        .map(|l| l.strip_prefix(margin).unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A text's lines, each with its line break.
fn lines_of(text: &str) -> Vec<&str> {
    text.split_inclusive('\n').collect()
}

/// `insert`: the code appended at the end of the file (nothing when it holds no statement, as
/// an empty module body adds nothing).
fn insert(text: &str, code: &str) -> String {
    let mut out = text.to_string();
    if scan(&code.split('\n').collect::<Vec<_>>())
        .logical
        .is_empty()
    {
        return out;
    }
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(code);
    out.push('\n');
    out
}

/// `rewrite`: the code's first statement, a `def` or `class`, in place of every outermost
/// definition of the same kind and name in `text`.
fn rewrite(text: &str, code: &str) -> Result<String, Failure> {
    let patch_lines: Vec<&str> = code.split('\n').collect();
    let patch = scan(&patch_lines);
    if patch.logical.is_empty() {
        return Err(Failure::Raise("its code holds no statement".into()));
    }
    let mut header = 0;
    while header + 1 < patch.logical.len() && patch.logical[header].head.starts_with('@') {
        header += 1;
    }
    let Some(wanted) = definition(&patch.logical[header].head) else {
        return Err(Failure::Stop(
            "its first statement is not a function or class definition".into(),
        ));
    };
    let last = patch.logical[extent(&patch, header)].last;
    let replacement: Vec<(bool, &str)> = (patch.logical[0].first..=last)
        .map(|j| (patch.in_string[j], patch_lines[j]))
        .collect();

    let lines = lines_of(text);
    let file = scan(&lines);
    let mut targets = Vec::new();
    let mut n = 0;
    while n < file.logical.len() {
        if definition(&file.logical[n].head).as_ref() == Some(&wanted) {
            let end = extent(&file, n);
            let first_line = file.logical[n].first;
            let line = lines[first_line];
            let indent = &line[..line.len() - line.trim_start_matches([' ', '\t']).len()];
            targets.push((
                file.logical[decorated_start(&file, n)].first,
                file.logical[end].last,
                indent,
            ));
            n = end + 1;
        } else {
            n += 1;
        }
    }
    if targets.is_empty() {
        let (kind, name) = &wanted;
        return Err(Failure::Stop(format!(
            "the file defines no {} `{name}`",
            match kind {
                Kind::Def => "function",
                Kind::Class => "class",
            }
        )));
    }
    let mut out: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    for (start, end, indent) in targets.into_iter().rev() {
        let mut new: Vec<String> = replacement
            .iter()
            .map(|(in_string, l)| {
                if *in_string || l.is_empty() {
                    format!("{l}\n")
                } else {
                    format!("{indent}{l}\n")
                }
            })
            .collect();
        if !out[end].ends_with('\n')
            && let Some(last) = new.last_mut()
        {
            last.pop();
        }
        out.splice(start..=end, new);
    }
    Ok(out.concat())
}

/// What a definition defines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Def,
    Class,
}

/// The kind and name a logical line starting with `def` or `class` defines (`async def` is
/// none: SWT-bench's rewrite handles neither its patch nor its target).
fn definition(head: &str) -> Option<(Kind, String)> {
    let (kind, rest) = if let Some(rest) = head.strip_prefix("def") {
        (Kind::Def, rest)
    } else {
        (Kind::Class, head.strip_prefix("class")?)
    };
    if !rest.starts_with([' ', '\t']) {
        return None;
    }
    let name: String = rest
        .trim_start()
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some((kind, name))
}

/// One logical line of Python source.
#[derive(Debug, Clone)]
struct Logical {
    /// Its first and last physical lines (0-based).
    first: usize,
    last: usize,
    /// The columns its first line is indented by (tabs to multiples of 8).
    indent: usize,
    /// Its first line without the indentation.
    head: String,
    /// Whether its code (strings and comments aside) ends with `:`.
    colon: bool,
}

/// Python source read as logical lines.
#[derive(Debug, Clone, Default)]
struct Source {
    logical: Vec<Logical>,
    /// Per physical line: whether it starts inside a string (its indentation is the string's).
    in_string: Vec<bool>,
    /// Why it would not parse (the first reason found), if it would not.
    error: Option<String>,
}

fn columns(line: &str) -> usize {
    let mut c = 0;
    for ch in line.chars() {
        match ch {
            ' ' => c += 1,
            '\t' => c = (c / 8 + 1) * 8,
            '\x0c' => c = 0,
            _ => break,
        }
    }
    c
}

fn fail(src: &mut Source, line: usize, why: &str) {
    if src.error.is_none() {
        src.error = Some(format!("line {}: {why}", line + 1));
    }
}

/// Reads `lines` (with or without their line breaks) as Python's tokenizer would, enough to
/// tell logical lines, their indentation, and the common syntax errors.
fn scan(lines: &[&str]) -> Source {
    let mut src = Source::default();
    let mut string: Option<(char, bool)> = None;
    let mut depth = 0usize;
    let mut continued = false;
    let mut current: Option<Logical> = None;
    let mut last_code: Option<char> = None;
    for (i, raw) in lines.iter().enumerate() {
        let line = raw.trim_end_matches(['\n', '\r']);
        src.in_string.push(string.is_some());
        if current.is_none() {
            let head = line.trim_start_matches([' ', '\t', '\x0c']);
            if head.is_empty() || head.starts_with('#') {
                continue;
            }
            current = Some(Logical {
                first: i,
                last: i,
                indent: columns(line),
                head: head.to_string(),
                colon: false,
            });
            last_code = None;
        }
        continued = false;
        let mut string_continues = false;
        let chars: Vec<char> = line.chars().collect();
        let mut k = 0;
        while k < chars.len() {
            let c = chars[k];
            if let Some((quote, triple)) = string {
                if c == '\\' {
                    string_continues = k + 1 == chars.len();
                    k += 2;
                    continue;
                }
                if c == quote {
                    if !triple {
                        string = None;
                    } else if chars.get(k + 1) == Some(&quote) && chars.get(k + 2) == Some(&quote) {
                        string = None;
                        k += 3;
                        continue;
                    }
                }
                k += 1;
                continue;
            }
            match c {
                '#' => break,
                '\'' | '"' => {
                    let triple = chars.get(k + 1) == Some(&c) && chars.get(k + 2) == Some(&c);
                    string = Some((c, triple));
                    last_code = Some(c);
                    k += if triple { 3 } else { 1 };
                    continue;
                }
                '(' | '[' | '{' => depth += 1,
                ')' | ']' | '}' => {
                    if depth == 0 {
                        fail(&mut src, i, &format!("unmatched `{c}`"));
                    } else {
                        depth -= 1;
                    }
                }
                '\\' => {
                    if k + 1 == chars.len() {
                        continued = true;
                    } else {
                        fail(&mut src, i, "a character after a line continuation");
                    }
                }
                '`' | '$' | '?' => fail(&mut src, i, &format!("invalid character {c:?}")),
                '!' if chars.get(k + 1) != Some(&'=') => fail(&mut src, i, "invalid `!`"),
                _ => {}
            }
            if !c.is_whitespace() && !continued {
                last_code = Some(c);
            }
            k += 1;
        }
        if let Some((_, false)) = string
            && !string_continues
        {
            fail(&mut src, i, "unterminated string literal");
            string = None;
        }
        if let Some(cur) = current.as_mut() {
            cur.last = i;
        }
        if string.is_none()
            && depth == 0
            && !continued
            && let Some(mut cur) = current.take()
        {
            cur.colon = last_code == Some(':');
            src.logical.push(cur);
        }
    }
    let end = lines.len().saturating_sub(1);
    if string.is_some() {
        fail(&mut src, end, "unterminated triple-quoted string");
    } else if depth > 0 {
        fail(&mut src, end, "a bracket is never closed");
    } else if continued {
        fail(
            &mut src,
            end,
            "unexpected end of file after a line continuation",
        );
    }
    if let Some(cur) = current.take() {
        src.logical.push(cur);
    }
    check_indentation(&mut src);
    src
}

/// Python's indentation rules over the logical lines (and decorators before a definition).
fn check_indentation(src: &mut Source) {
    if src.error.is_some() {
        return;
    }
    let mut levels = vec![0];
    let mut expect_block = false;
    let mut why = None;
    for (n, l) in src.logical.iter().enumerate() {
        let top = *levels.last().unwrap_or(&0);
        if expect_block {
            if l.indent <= top {
                why = Some((l.first, "expected an indented block"));
                break;
            }
            levels.push(l.indent);
        } else if l.indent > top {
            why = Some((l.first, "unexpected indent"));
            break;
        } else {
            while levels.last().is_some_and(|&v| v > l.indent) {
                levels.pop();
            }
            if levels.last() != Some(&l.indent) {
                why = Some((
                    l.first,
                    "unindent does not match any outer indentation level",
                ));
                break;
            }
        }
        expect_block = l.colon;
        if l.head.starts_with('@') {
            let decorates = src.logical.get(n + 1).is_some_and(|next| {
                next.indent == l.indent
                    && (next.head.starts_with('@')
                        || next.head.starts_with("async ")
                        || definition(&next.head).is_some())
            });
            if !decorates {
                why = Some((l.first, "a decorator is not followed by a definition"));
                break;
            }
        }
    }
    if why.is_none()
        && expect_block
        && let Some(l) = src.logical.last()
    {
        why = Some((l.last, "expected an indented block at the end"));
    }
    if let Some((line, what)) = why {
        src.error = Some(format!("line {}: {what}", line + 1));
    }
}

/// The index of the last logical line of the block the logical line `header` opens.
fn extent(src: &Source, header: usize) -> usize {
    let indent = src.logical[header].indent;
    let mut last = header;
    while src.logical.get(last + 1).is_some_and(|l| l.indent > indent) {
        last += 1;
    }
    last
}

/// The index of the first decorator of the definition at `header` (itself when it has none).
fn decorated_start(src: &Source, header: usize) -> usize {
    let indent = src.logical[header].indent;
    let mut start = header;
    while start > 0
        && src.logical[start - 1].head.starts_with('@')
        && src.logical[start - 1].indent == indent
    {
        start -= 1;
    }
    start
}

/// A git diff of `path` from `old` to `new`: one hunk over the changed lines with up to three
/// lines of context either side (empty when the texts are equal).
pub fn unified_diff(path: &str, old: &str, new: &str) -> String {
    let (a, b) = (lines_of(old), lines_of(new));
    let prefix = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    if prefix == a.len() && prefix == b.len() {
        return String::new();
    }
    let suffix = (0..a.len().min(b.len()) - prefix)
        .take_while(|&k| a[a.len() - 1 - k] == b[b.len() - 1 - k])
        .count();
    let start = prefix.saturating_sub(3);
    let (a_end, b_end) = (
        (a.len() - suffix + 3).min(a.len()),
        (b.len() - suffix + 3).min(b.len()),
    );
    let range = |count: usize| match count {
        0 => format!("{start},0"),
        1 => format!("{}", start + 1),
        n => format!("{},{n}", start + 1),
    };
    let mut out = format!(
        "diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n@@ -{} +{} @@\n",
        range(a_end - start),
        range(b_end - start)
    );
    let mut put = |mark: char, line: &str| {
        out.push(mark);
        out.push_str(line);
        if !line.ends_with('\n') {
            out.push_str("\n\\ No newline at end of file\n");
        }
    };
    a[start..prefix].iter().for_each(|l| put(' ', l));
    a[prefix..a.len() - suffix].iter().for_each(|l| put('-', l));
    b[prefix..b.len() - suffix].iter().for_each(|l| put('+', l));
    a[a.len() - suffix..a_end].iter().for_each(|l| put(' ', l));
    out
}

/// A custom diff's text: its blocks in a ```custom-diff fence. A block whose code has a line
/// that would end or start a block (`end diff`, `diff...`) is indented by four spaces, which the
/// dedent removes again.
pub fn render(blocks: &[Block]) -> String {
    let mut out = String::from("```custom-diff\n");
    for b in blocks {
        let guard = b
            .code
            .iter()
            .any(|l| l.starts_with("diff") || l.starts_with("end diff"));
        out.push_str(&format!("diff\n{}\n{}\n{}\n", b.file, b.mode, b.position));
        for l in &b.code {
            if guard && !l.trim().is_empty() {
                out.push_str("    ");
            }
            out.push_str(l);
            out.push('\n');
        }
        out.push_str("end diff\n");
    }
    out.push_str("```\n");
    out
}

/// A top-level statement of a file: what it defines, and its physical lines (decorators and
/// body included).
struct Unit {
    defines: Option<(Kind, String)>,
    first: usize,
    last: usize,
}

fn units(src: &Source) -> Vec<Unit> {
    let mut out = Vec::new();
    let mut n = 0;
    while n < src.logical.len() {
        let mut header = n;
        while header + 1 < src.logical.len() && src.logical[header].head.starts_with('@') {
            header += 1;
        }
        let end = extent(src, header);
        out.push(Unit {
            defines: definition(&src.logical[header].head),
            first: src.logical[n].first,
            last: src.logical[end].last,
        });
        n = end + 1;
    }
    out
}

/// Blocks that turn `path` from `before` (`None`: no such file) into `after`, as far as the
/// format can (what a perfect model answers): a new file or an appended tail is one `insert`;
/// otherwise each top-level `def` or `class` that `after` changes is a `rewrite` (of the whole
/// definition, in `after`'s text) and the top-level statements `before` lacks are one `insert`
/// at the end: `after`'s text past its last known statement when they all come after it
/// (exact), else each of them in order (the format cannot put code before existing code).
pub fn blocks_between(path: &str, before: Option<&str>, after: &str) -> Vec<Block> {
    let block = |mode: &str, position: String, code: &str| Block {
        file: path.to_string(),
        mode: mode.to_string(),
        position,
        code: code
            .strip_suffix('\n')
            .unwrap_or(code)
            .split('\n')
            .map(str::to_string)
            .collect(),
    };
    let Some(before) = before else {
        return vec![block("insert", "EOF".into(), after)];
    };
    if before == after {
        return Vec::new();
    }
    if let Some(tail) = after.strip_prefix(before)
        && (before.is_empty() || before.ends_with('\n'))
    {
        return vec![block("insert", "EOF".into(), tail)];
    }
    let (bl, al) = (lines_of(before), lines_of(after));
    let (bu, au) = (units(&scan(&bl)), units(&scan(&al)));
    let text = |lines: &[&str], u: &Unit| lines[u.first..=u.last].concat();
    let mut blocks = Vec::new();
    let mut last_known: Option<usize> = None;
    let mut fresh = Vec::new();
    for (k, u) in au.iter().enumerate() {
        let known = match &u.defines {
            Some(defines) => match bu.iter().find(|b| b.defines.as_ref() == Some(defines)) {
                Some(b) => {
                    let new = text(&al, u);
                    if text(&bl, b) != new {
                        blocks.push(block("rewrite", (b.first + 1).to_string(), &new));
                    }
                    true
                }
                None => false,
            },
            None => bu
                .iter()
                .any(|b| b.defines.is_none() && text(&bl, b) == text(&al, u)),
        };
        if known {
            last_known = Some(k);
        } else {
            fresh.push(k);
        }
    }
    if !fresh.is_empty() {
        let code = if fresh.iter().all(|&k| last_known.is_none_or(|l| k > l)) {
            let tail = al[last_known.map_or(0, |l| au[l].last + 1)..].concat();
            let before_tail = bl[bu.last().map_or(0, |u| u.last + 1)..].concat();
            tail.strip_prefix(&before_tail).unwrap_or(&tail).to_string()
        } else {
            fresh
                .iter()
                .map(|&k| format!("\n\n{}", text(&al, &au[k])))
                .collect()
        };
        blocks.push(block("insert", "EOF".into(), &code));
    }
    blocks
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The conversion of `answer` over files `(path, text at the base commit)`.
    fn convert_over(answer: &str, files: &[(&str, &str)]) -> Conversion {
        let files: BTreeMap<String, String> = files
            .iter()
            .map(|(p, t)| (p.to_string(), t.to_string()))
            .collect();
        convert(&parse(answer), |p| Ok(files.get(p).cloned()))
    }

    /// `file`'s text after the conversion's patch (`base`: its text before, "" when new).
    fn after(conversion: &Conversion, file: &str, base: &str) -> String {
        let patch = conversion.patch.as_deref().expect("a patch");
        patch::apply_to_text(base, patch, file).unwrap()
    }

    const DEMO: &str = "def test_euclidean(a, b):\n    assert euclidean(0, 0) == 0\n    assert euclidean(0, 1) == 1\n    assert euclidean(1, 0) == 1\n    assert euclidean(1, 1) == 1\n\n@pytest.mark.parametrize(\"a, b, expected\", [(0, 0, 0), (0, 1, 1), (1, 0, 1), (1, 1, 1)])\ndef test_gcd(a, b):\n    assert gcd(a, b) == expected\n";

    #[test]
    fn swt_bench_s_own_example_rewrites_and_appends() {
        let answer = "Reasoning first.\n```custom-diff\ndiff\ndemo/file.py\nrewrite\n1\ndef test_euclidean(a, b):\n    assert euclidean(0, 0) == 0\n    assert euclidean(0, 1) == 1\n    assert euclidean(1, 0) == 1\n    assert euclidean(1, 1) == 1\n    assert euclidean(100, 10) == 10\nend diff\ndiff\ndemo/file.py\ninsert\nEOF\n@pytest.mark.parametrize(\"a, b, expected\", [(0, 0, 0), (0, 1, 1), (1, 0, 1), (1, 1, 1), (100, 10, 10)])\ndef test_lcm(a, b):\n    assert lcm(a, b) == expected\nend diff\n```\n";
        let blocks = parse(answer);
        assert_eq!(blocks.len(), 2);
        assert_eq!(
            (blocks[1].mode.as_str(), blocks[1].position.as_str()),
            ("insert", "EOF")
        );
        let c = convert_over(answer, &[("demo/file.py", DEMO)]);
        assert_eq!(c.notes, Vec::<String>::new());
        let text = after(&c, "demo/file.py", DEMO);
        assert!(
            text.starts_with("def test_euclidean(a, b):\n    assert euclidean(0, 0) == 0\n"),
            "{text}"
        );
        assert!(text.contains("    assert euclidean(100, 10) == 10\n\n@pytest.mark.parametrize(\"a, b, expected\", [(0, 0, 0), (0, 1, 1), (1, 0, 1), (1, 1, 1)])\ndef test_gcd"));
        assert!(text.ends_with("    assert gcd(a, b) == expected\n@pytest.mark.parametrize(\"a, b, expected\", [(0, 0, 0), (0, 1, 1), (1, 0, 1), (1, 1, 1), (100, 10, 10)])\ndef test_lcm(a, b):\n    assert lcm(a, b) == expected\n"), "{text}");
    }

    #[test]
    fn insert_appends_at_the_end_whatever_the_position() {
        let base = "import os\n\n\ndef test_a():\n    pass\n";
        for position in ["BOF", "EOF", "3", "rough 1"] {
            let answer =
                format!("diff\ntests/test_a.py\ninsert\n{position}\nimport sys\nend diff\n");
            let c = convert_over(&answer, &[("tests/test_a.py", base)]);
            assert_eq!(
                after(&c, "tests/test_a.py", base),
                format!("{base}import sys\n"),
                "{position}"
            );
        }
        // Indented code is dedented first; blank lines are kept.
        let answer =
            "diff\ntests/test_a.py\ninsert\nEOF\n\n\n    def test_b():\n        assert 1\nend diff";
        let c = convert_over(answer, &[("tests/test_a.py", base)]);
        assert_eq!(
            after(&c, "tests/test_a.py", base),
            format!("{base}\n\ndef test_b():\n    assert 1\n")
        );
    }

    #[test]
    fn blocks_apply_in_the_string_order_of_their_positions() {
        // "10" < "9" < "BOF" < "EOF": the insert at 10 comes first, the one at BOF third.
        let answer = "diff\nt.py\ninsert\nEOF\nd = 4\nend diff\ndiff\nt.py\ninsert\nBOF\nc = 3\nend diff\ndiff\nt.py\ninsert\n9\nb = 2\nend diff\ndiff\nt.py\ninsert\n10\na = 1\nend diff\n";
        let c = convert_over(answer, &[]);
        assert_eq!(after(&c, "t.py", ""), "a = 1\nb = 2\nc = 3\nd = 4\n");
    }

    #[test]
    fn rewrite_replaces_every_outermost_definition_of_the_name_in_place() {
        let base = "import unittest\n\n\nclass TestA(unittest.TestCase):\n    @staticmethod\n    def helper():\n        return 1\n\n    def test_x(self):\n        # old\n        self.assertEqual(self.helper(), 1)\n\n    # a comment that stays\n\n\nclass TestB(unittest.TestCase):\n    def test_x(self):\n        s = \"\"\"\nkept\"\"\"\n";
        let answer = "diff\ntests/test_a.py\nrewrite\n9\n    def test_x(self):\n        s = '''\n      raw'''\n        self.assertEqual(s, '\\n  raw')\nend diff\n";
        let c = convert_over(answer, &[("tests/test_a.py", base)]);
        let text = after(&c, "tests/test_a.py", base);
        let method = "    def test_x(self):\n        s = '''\n  raw'''\n        self.assertEqual(s, '\\n  raw')\n";
        assert_eq!(
            text,
            format!(
                "import unittest\n\n\nclass TestA(unittest.TestCase):\n    @staticmethod\n    def helper():\n        return 1\n\n{method}\n    # a comment that stays\n\n\nclass TestB(unittest.TestCase):\n{method}"
            )
        );
        // A class rewrite takes the decorators with it; only the first statement counts.
        let base = "@dec\nclass T:\n    x = 1\n\ny = 2\n";
        let answer = "diff\nt.py\nrewrite\n1\nclass T:\n    x = 3\nz = 4\nend diff";
        let c = convert_over(answer, &[("t.py", base)]);
        assert_eq!(after(&c, "t.py", base), "class T:\n    x = 3\n\ny = 2\n");
    }

    #[test]
    fn a_failure_stops_at_its_file_and_keeps_the_files_before() {
        let (a, b) = ("def test_a():\n    pass\n", "def test_b():\n    pass\n");
        let files = [("a.py", a), ("b.py", b)];
        // b.py's rewrite names nothing b.py defines: a.py (position 1) keeps its insert.
        let answer = "diff\na.py\ninsert\n1\nx = 1\nend diff\ndiff\nb.py\nrewrite\n2\ndef test_zzz():\n    pass\nend diff\ndiff\nb.py\ninsert\n3\ny = 2\nend diff";
        let c = convert_over(answer, &files);
        let patch = c.patch.as_deref().unwrap();
        assert!(
            patch.contains("+++ b/a.py") && !patch.contains("b.py"),
            "{patch}"
        );
        assert!(
            c.notes[0].contains("defines no function `test_zzz`"),
            "{c:?}"
        );
        // A block that does not parse stops too; so does a rewrite of no definition.
        for code in [
            "def test_b(:\n    pass",
            "x = `1`",
            "def f():\nreturn 1",
            "import os",
        ] {
            let answer = format!("diff\nb.py\nrewrite\n1\n{code}\nend diff");
            let c = convert_over(&answer, &files);
            assert_eq!(c.patch, None, "{code}");
            assert!(c.notes[0].contains("SWT-bench stops"), "{c:?}");
        }
        // A rewrite without a statement raises in SWT-bench: no patch, not even a.py's.
        let answer =
            "diff\na.py\ninsert\n1\nx = 1\nend diff\ndiff\nb.py\nrewrite\n2\n# nothing\nend diff";
        let c = convert_over(answer, &files);
        assert_eq!(c.patch, None);
        assert!(c.notes[0].contains("raises"), "{c:?}");
        // So does a file that cannot be read.
        let c = convert(&parse("diff\nd\ninsert\n1\nx = 1\nend diff"), |_| {
            Err("`d` is a directory".to_string())
        });
        assert_eq!(c.patch, None);
    }

    #[test]
    fn malformed_answers_read_as_swt_bench_reads_them() {
        // Too few lines after `diff`: no block.
        assert_eq!(parse("diff\nt.py\ninsert"), Vec::new());
        // No `end diff`: the code runs to the line before the last.
        let blocks = parse("diff\nt.py\ninsert\nEOF\nx = 1\ny = 2\n```");
        assert_eq!(blocks[0].code, vec!["x = 1", "y = 2"]);
        let blocks = parse("diff\nt.py\ninsert\nEOF\nx = 1");
        assert_eq!(blocks[0].code, Vec::<String>::new());
        // A unified diff makes blocks too, but none is a rewrite or an insert.
        let unified =
            parse("diff --git a/t.py b/t.py\n--- a/t.py\n+++ b/t.py\n@@ -1 +1 @@\n-a\n+b\n");
        assert_eq!(unified.len(), 1);
        assert!(!is_custom_diff(&unified));
        // Other modes change nothing; an unclosed fence in the code does not parse.
        let c = convert_over("diff\nt.py\nreplace\n1\nx = 1\nend diff", &[]);
        assert_eq!(c.patch, None);
        assert!(c.notes[0].contains("neither"), "{c:?}");
        let c = convert_over("diff\nt.py\ninsert\nEOF\nx = 1\n```\nThat is all.", &[]);
        assert_eq!(c.patch, None);
        // Paths outside the repository are applied but left out of the patch.
        assert_eq!(repo_path("./tests//t.py").as_deref(), Some("tests/t.py"));
        for p in ["/etc/t.py", "../t.py", "tests/t.py ", ""] {
            assert_eq!(repo_path(p), None, "{p}");
        }
        let c = convert_over("diff\n../t.py\ninsert\nEOF\nx = 1\nend diff", &[]);
        assert_eq!(c.patch, None);
        assert!(c.notes[0].contains("left out"), "{c:?}");
    }

    #[test]
    fn a_new_file_is_made_of_its_inserts() {
        let answer = "```custom-diff\ndiff\ntests/test_new.py\ninsert\nBOF\nimport pytest\n\n\ndef test_new():\n    with pytest.raises(ValueError):\n        int('x')\nend diff\n```";
        let c = convert_over(answer, &[]);
        let patch = c.patch.as_deref().unwrap();
        assert!(patch.contains("new file mode 100644"), "{patch}");
        assert_eq!(
            after(&c, "tests/test_new.py", ""),
            "import pytest\n\n\ndef test_new():\n    with pytest.raises(ValueError):\n        int('x')\n"
        );
    }

    #[test]
    fn the_scanner_tells_python_from_what_is_not() {
        let ok = |code: &str| scan(&code.split('\n').collect::<Vec<_>>()).error;
        for good in [
            "x = (1,\n  2)\nif x:\n    y = '#'  # c\nelse:\n    pass\n",
            "s = \"\"\"\n`$?\n\"\"\"\nt = 'a\\\nb'\nu = x != 1\n",
            "class A:\n    def f(self):\n        return {\n'k': 1}\n\n    # c\n  # odd comment\n    g = 2\n",
            "@d\n@e(1)\ndef f(): pass\n",
            "",
        ] {
            assert_eq!(ok(good), None, "{good}");
        }
        for bad in [
            "x = (1,\n",
            "  x = 1",
            "if x:\ny = 1",
            "if x:\n    y = 1\n  z = 2",
            "s = 'abc\n",
            "Here is the test:",
            "@d\nx = 1",
            "def f():",
        ] {
            assert!(ok(bad).is_some(), "{bad}");
        }
        assert_eq!(dedent("    a\n      b\n  \n    c"), "a\n  b\n\nc");
        assert_eq!(dedent("\ta\n  b"), "\ta\n  b");
    }

    /// `file`'s text after `git apply` of `patch` in a repository holding `file` with `text`;
    /// `Err` is git's complaint.
    fn git_apply(file: &str, text: &str, patch: &str) -> Result<String, String> {
        let dir = tempfile::tempdir().unwrap();
        let full = dir.path().join(file);
        std::fs::create_dir_all(full.parent().unwrap()).unwrap();
        std::fs::write(&full, text).unwrap();
        std::fs::write(dir.path().join("x.patch"), patch).unwrap();
        let git = |args: &[&str]| {
            std::process::Command::new("git")
                .arg("-C")
                .arg(dir.path())
                .args(args)
                .output()
                .unwrap()
        };
        assert!(git(&["init", "-q"]).status.success());
        let out = git(&["apply", "x.patch"]);
        if !out.status.success() {
            return Err(format!("{patch}\n{}", String::from_utf8_lossy(&out.stderr)));
        }
        Ok(std::fs::read_to_string(full).unwrap())
    }

    #[test]
    fn git_applies_the_patches_the_conversion_writes() {
        let base = "import os\n\n\nclass TestA:\n    def test_x(self):\n        assert 1\n\n\ndef test_y():\n    assert os.sep\n\n\ndef test_z():\n    pass";
        let answer = "diff\ntests/test_a.py\nrewrite\n5\ndef test_x(self):\n    assert 2\nend diff\ndiff\ntests/test_a.py\ninsert\nEOF\ndef test_w():\n    pass\nend diff\ndiff\ntests/test_new.py\ninsert\n1\ndef test_n():\n    pass\nend diff";
        let c = convert_over(answer, &[("tests/test_a.py", base)]);
        let expected = base.replace("assert 1", "assert 2") + "\ndef test_w():\n    pass\n";
        assert_eq!(after(&c, "tests/test_a.py", base), expected);
        assert_eq!(
            git_apply("tests/test_a.py", base, c.patch.as_deref().unwrap()),
            Ok(expected)
        );
        // Diffs at the start, the end, with and without final newlines.
        for (old, new) in [
            ("a\nb\nc\nd\ne\nf\ng\nh\n", "A\nb\nc\nd\ne\nf\ng\nH\n"),
            ("a\nb", "a\nb\n"),
            ("a\nb\n", "a\nb"),
            ("", "x\n"),
            ("x\n", ""),
            (
                "1\n2\n3\n4\n5\n6\n7\n8\n9\n",
                "1\n2\n3\n4\n5\nfive\n6\n7\n8\n9\n",
            ),
        ] {
            let patch = unified_diff("f.txt", old, new);
            assert_eq!(git_apply("f.txt", old, &patch).as_deref(), Ok(new));
            assert_eq!(patch::apply_to_text(old, &patch, "f.txt").unwrap(), new);
        }
        assert_eq!(unified_diff("f", "a\n", "a\n"), "");
    }

    #[test]
    fn the_blocks_between_two_versions_convert_back_to_the_second() {
        let base = "import unittest\n\nfrom m import f\n\n\nclass TestF(unittest.TestCase):\n    def test_one(self):\n        self.assertEqual(f(1), 1)\n\n\ndef test_free():\n    assert f(0) == 0\n";
        let cases = [
            // A method added to a class and a function appended: exact.
            base.replace(
                "        self.assertEqual(f(1), 1)\n",
                "        self.assertEqual(f(1), 1)\n\n    def test_two(self):\n        self.assertEqual(f(2), 2)\n",
            ) + "\n\ndef test_more():\n    assert f(3) == 3\n",
            // A function appended.
            base.to_string() + "\n\ndef test_last():\n    assert True\n",
        ];
        for golden in &cases {
            let blocks = blocks_between("tests/test_f.py", Some(base), golden);
            let answer = render(&blocks);
            let c = convert_over(&answer, &[("tests/test_f.py", base)]);
            assert_eq!(&after(&c, "tests/test_f.py", base), golden, "{answer}");
        }
        // A new import at the top cannot go there: it is appended with the new test.
        let golden = base.replace("from m import f\n", "from m import f, g\n")
            + "\n\ndef test_g():\n    assert g() is None\n";
        let blocks = blocks_between("tests/test_f.py", Some(base), &golden);
        let c = convert_over(&render(&blocks), &[("tests/test_f.py", base)]);
        let text = after(&c, "tests/test_f.py", base);
        assert!(
            text.ends_with("\n\nfrom m import f, g\n\n\ndef test_g():\n    assert g() is None\n"),
            "{text}"
        );
        // A new file, and code whose lines would end a block.
        let golden = "X = '''\ndiff\nend diff\n'''\n\n\ndef test_x():\n    assert X\n";
        let answer = render(&blocks_between("tests/test_x.py", None, golden));
        let c = convert_over(&answer, &[]);
        assert_eq!(after(&c, "tests/test_x.py", ""), golden, "{answer}");
    }
}
