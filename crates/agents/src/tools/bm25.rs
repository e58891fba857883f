//! BM25 ranking over code: an identifier-aware tokenizer, an index, and chunking of a
//! checkout's Python files along their definitions.

use super::codegraph::CodeGraph;
use super::repo::RepoView;
use std::collections::HashMap;

/// BM25 term-frequency saturation.
const K1: f64 = 1.2;
/// BM25 length normalisation.
const B: f64 = 0.75;

/// Lowercased tokens of `text`: each identifier whole, plus its snake_case and camelCase parts
/// when it has several; tokens of one character are dropped.
pub fn tokenize(text: &str) -> Vec<String> {
    let mut tokens = Vec::new();
    for word in text
        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .map(|word| word.trim_matches('_'))
        .filter(|word| !word.is_empty())
    {
        let parts = identifier_parts(word);
        if parts.len() > 1 {
            push_token(&mut tokens, word);
        }
        for part in parts {
            push_token(&mut tokens, part);
        }
    }
    tokens
}

fn push_token(tokens: &mut Vec<String>, token: &str) {
    if token.chars().count() > 1 {
        tokens.push(token.to_lowercase());
    }
}

/// The snake_case and camelCase parts of `word` (`HTTPServerError` gives `HTTP`, `Server`,
/// `Error`; `parse_v2Config` gives `parse`, `v2`, `Config`).
fn identifier_parts(word: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    for piece in word.split('_').filter(|piece| !piece.is_empty()) {
        let chars: Vec<(usize, char)> = piece.char_indices().collect();
        let mut start = 0;
        for index in 1..chars.len() {
            let (byte, current) = chars[index];
            let previous = chars[index - 1].1;
            let next_is_lower = chars.get(index + 1).is_some_and(|&(_, c)| c.is_lowercase());
            let boundary = current.is_uppercase()
                && (previous.is_lowercase()
                    || previous.is_numeric()
                    || (previous.is_uppercase() && next_is_lower));
            if boundary {
                parts.push(&piece[start..byte]);
                start = byte;
            }
        }
        parts.push(&piece[start..]);
    }
    parts
}

/// An Okapi BM25 index (k1 = 1.2, b = 0.75) over a list of documents.
#[derive(Debug, Clone, Default)]
pub struct Bm25Index {
    postings: HashMap<String, Vec<(usize, u32)>>,
    doc_lengths: Vec<usize>,
    average_length: f64,
}

impl Bm25Index {
    /// Indexes `docs`; search results refer to them by position.
    pub fn build(docs: &[String]) -> Bm25Index {
        let mut postings: HashMap<String, Vec<(usize, u32)>> = HashMap::new();
        let mut doc_lengths = Vec::with_capacity(docs.len());
        for (doc, text) in docs.iter().enumerate() {
            let tokens = tokenize(text);
            doc_lengths.push(tokens.len());
            let mut counts: HashMap<String, u32> = HashMap::new();
            for token in tokens {
                *counts.entry(token).or_default() += 1;
            }
            for (token, count) in counts {
                postings.entry(token).or_default().push((doc, count));
            }
        }
        let total: usize = doc_lengths.iter().sum();
        let average_length = if doc_lengths.is_empty() {
            0.0
        } else {
            total as f64 / doc_lengths.len() as f64
        };
        Bm25Index {
            postings,
            doc_lengths,
            average_length,
        }
    }

    /// Number of indexed documents.
    pub fn len(&self) -> usize {
        self.doc_lengths.len()
    }

    /// Whether no documents are indexed.
    pub fn is_empty(&self) -> bool {
        self.doc_lengths.is_empty()
    }

    /// The `k` best documents for `query` as `(position, score)`, best first (ties by position);
    /// documents sharing no token with the query are left out.
    pub fn search(&self, query: &str, k: usize) -> Vec<(usize, f64)> {
        let mut terms = tokenize(query);
        terms.sort();
        terms.dedup();
        let doc_count = self.doc_lengths.len() as f64;
        let mut scores: HashMap<usize, f64> = HashMap::new();
        for term in &terms {
            let Some(postings) = self.postings.get(term) else {
                continue;
            };
            let frequency = postings.len() as f64;
            let idf = (1.0 + (doc_count - frequency + 0.5) / (frequency + 0.5)).ln();
            for &(doc, count) in postings {
                let count = f64::from(count);
                let length_ratio = if self.average_length > 0.0 {
                    self.doc_lengths[doc] as f64 / self.average_length
                } else {
                    1.0
                };
                let saturation = count * (K1 + 1.0) / (count + K1 * (1.0 - B + B * length_ratio));
                *scores.entry(doc).or_default() += idf * saturation;
            }
        }
        let mut ranked: Vec<(usize, f64)> = scores.into_iter().collect();
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        ranked.truncate(k);
        ranked
    }
}

/// A run of lines of one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeChunk {
    /// File path relative to the root.
    pub path: String,
    /// First line, 1-based.
    pub start_line: usize,
    /// Last line, 1-based, inclusive.
    pub end_line: usize,
    /// The lines' text.
    pub text: String,
}

/// Chunks of every parsed Python file: one per top-level function and class (split into
/// windows of `max_lines` when longer), plus windows of at most `max_lines` over the module-level
/// code between them (blank lines at their edges trimmed, blank-only stretches dropped).
pub fn code_chunks(repo: &RepoView, graph: &CodeGraph, max_lines: usize) -> Vec<CodeChunk> {
    let max_lines = max_lines.max(1);
    let mut chunks = Vec::new();
    for path in graph.files() {
        let Ok(source) = repo.read_text(path) else {
            continue;
        };
        let lines: Vec<&str> = source.lines().collect();
        let mut covered = vec![false; lines.len()];
        let mut ranges = Vec::new();
        for def in graph.definitions_in(path) {
            if def.qualname.contains('.') || def.start_line > lines.len() {
                continue;
            }
            let end = def.end_line.min(lines.len());
            covered[def.start_line - 1..end]
                .iter_mut()
                .for_each(|line| *line = true);
            ranges.push((def.start_line, end));
        }
        let mut line = 1;
        while line <= lines.len() {
            if covered[line - 1] {
                line += 1;
                continue;
            }
            let mut start = line;
            while line <= lines.len() && !covered[line - 1] {
                line += 1;
            }
            let mut end = line - 1;
            let blank = |number: usize| lines[number - 1].trim().is_empty();
            while start <= end && blank(start) {
                start += 1;
            }
            while end >= start && blank(end) {
                end -= 1;
            }
            if start <= end {
                ranges.push((start, end));
            }
        }
        ranges.sort();
        for (start, end) in ranges {
            let mut window_start = start;
            while window_start <= end {
                let window_end = (window_start + max_lines - 1).min(end);
                chunks.push(CodeChunk {
                    path: path.to_string(),
                    start_line: window_start,
                    end_line: window_end,
                    text: lines[window_start - 1..window_end].join("\n"),
                });
                window_start = window_end + 1;
            }
        }
    }
    chunks
}

/// The `k` chunks (of at most 80 lines) of `repo` that best match `query`, best first. Each
/// chunk is indexed with its path and the names of the definitions it starts.
pub fn retrieve(repo: &RepoView, graph: &CodeGraph, query: &str, k: usize) -> Vec<CodeChunk> {
    let chunks = code_chunks(repo, graph, 80);
    let docs: Vec<String> = chunks
        .iter()
        .map(|chunk| {
            let names: Vec<&str> = graph
                .definitions_in(&chunk.path)
                .into_iter()
                .filter(|def| (chunk.start_line..=chunk.end_line).contains(&def.start_line))
                .map(|def| def.qualname.as_str())
                .collect();
            format!("{}\n{}\n{}", chunk.path, names.join(" "), chunk.text)
        })
        .collect();
    let index = Bm25Index::build(&docs);
    index
        .search(query, k)
        .into_iter()
        .map(|(position, _)| chunks[position].clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_split_identifiers_and_keep_them_whole() {
        assert_eq!(
            tokenize("parse_http_header(x)"),
            ["parse_http_header", "parse", "http", "header"]
        );
        assert_eq!(
            tokenize("HTTPServerError.getValue"),
            [
                "httpservererror",
                "http",
                "server",
                "error",
                "getvalue",
                "get",
                "value"
            ]
        );
        assert_eq!(tokenize("a = b + cc"), ["cc"]);
        assert_eq!(tokenize("__init__"), ["init"]);
    }

    #[test]
    fn search_ranks_by_bm25_and_skips_unrelated_documents() {
        let docs = vec![
            "def save(self): write the model to the database".to_string(),
            "def load(): read the model".to_string(),
            "unrelated text about cooking".to_string(),
            "save the file".to_string(),
        ];
        let index = Bm25Index::build(&docs);
        let ranked = index.search("save model", 10);
        assert_eq!(ranked.len(), 3);
        assert_eq!(ranked[0].0, 0, "{ranked:?}");
        assert!(ranked.windows(2).all(|pair| pair[0].1 >= pair[1].1));
        assert!(ranked.iter().all(|&(doc, _)| doc != 2));
        assert_eq!(index.search("save", 1).len(), 1);
        assert!(index.search("nothing matches", 5).is_empty());
    }

    #[test]
    fn scores_follow_the_bm25_formula() {
        let docs = vec!["aa bb".to_string(), "bb cc".to_string()];
        let ranked = Bm25Index::build(&docs).search("aa", 5);
        assert_eq!(ranked.len(), 1);
        assert_eq!(ranked[0].0, 0);
        assert!((ranked[0].1 - 2f64.ln()).abs() < 1e-12, "{ranked:?}");
    }

    #[test]
    fn rarer_terms_weigh_more() {
        let docs = vec![
            "common common rare".to_string(),
            "common common common".to_string(),
            "common other words".to_string(),
        ];
        let ranked = Bm25Index::build(&docs).search("common rare", 3);
        assert_eq!(ranked[0].0, 0);
    }
}
