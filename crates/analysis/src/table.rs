//! One table type for every paper table, and its renderers: terminal, Markdown, LaTeX
//! (booktabs), CSV and JSON (an array of row objects keyed by snake_case column names). Pure.

use std::fmt::Write;

/// A column: a snake_case key (JSON, CSV) and a header for people (terminal, Markdown, LaTeX).
#[derive(Debug, Clone, PartialEq)]
pub struct Column {
    /// snake_case key, e.g. `success_rate_pct`.
    pub key: String,
    /// Header, e.g. `SR (%)`.
    pub header: String,
}

/// A cell value.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    /// Text.
    Text(String),
    /// A count.
    Int(i64),
    /// A number shown with `decimals` places.
    Num {
        /// Value.
        value: f64,
        /// Places shown.
        decimals: u8,
    },
    /// A mean with its standard deviation over repeats (JSON: the mean under the key, the spread under `KEY_std`).
    MeanStd {
        /// Mean.
        mean: f64,
        /// Standard deviation (None with a single repeat).
        std: Option<f64>,
        /// Places shown.
        decimals: u8,
    },
    /// Nothing (not applicable).
    Empty,
}

impl Cell {
    /// Text cell.
    pub fn text(s: impl Into<String>) -> Cell {
        Cell::Text(s.into())
    }

    /// Number cell with `decimals` places; NaN becomes empty.
    pub fn num(value: f64, decimals: u8) -> Cell {
        if value.is_finite() {
            Cell::Num { value, decimals }
        } else {
            Cell::Empty
        }
    }

    fn plain(&self) -> String {
        match self {
            Cell::Text(s) => s.clone(),
            Cell::Int(i) => i.to_string(),
            Cell::Num { value, decimals } => format!("{value:.*}", *decimals as usize),
            Cell::MeanStd {
                mean,
                std: Some(s),
                decimals,
            } => {
                format!("{mean:.d$} ± {s:.d$}", d = *decimals as usize)
            }
            Cell::MeanStd {
                mean,
                std: None,
                decimals,
            } => format!("{mean:.*}", *decimals as usize),
            Cell::Empty => "-".into(),
        }
    }

    fn latex(&self) -> String {
        match self {
            Cell::MeanStd {
                mean,
                std: Some(s),
                decimals,
            } => {
                format!("{mean:.d$} $\\pm$ {s:.d$}", d = *decimals as usize)
            }
            Cell::Text(s) => latex_escape(s),
            other => other.plain(),
        }
    }

    fn is_numeric(&self) -> bool {
        !matches!(self, Cell::Text(_))
    }
}

/// A table with a title and an optional note (e.g. which rows are published figures).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Table {
    /// Title (LaTeX caption, Markdown heading).
    pub title: String,
    /// Columns.
    pub columns: Vec<Column>,
    /// Rows, each as long as `columns`.
    pub rows: Vec<Vec<Cell>>,
    /// A line printed under the table.
    pub note: Option<String>,
}

impl Table {
    /// A table with these (key, header) columns.
    pub fn new(title: impl Into<String>, columns: &[(&str, &str)]) -> Table {
        Table {
            title: title.into(),
            columns: columns
                .iter()
                .map(|(k, h)| Column {
                    key: k.to_string(),
                    header: h.to_string(),
                })
                .collect(),
            rows: Vec::new(),
            note: None,
        }
    }

    /// Appends a row (padded with empty cells, or cut, to the column count).
    pub fn push(&mut self, mut row: Vec<Cell>) {
        row.resize(self.columns.len(), Cell::Empty);
        self.rows.push(row);
    }
}

/// Output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Aligned plain text.
    Term,
    /// GitHub Markdown.
    Markdown,
    /// LaTeX with booktabs.
    Latex,
    /// CSV with the snake_case keys as header.
    Csv,
    /// JSON array of row objects.
    Json,
}

/// A format name that is none of [`Format`]'s.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown format `{name}`; use term, md, latex, csv or json")]
pub struct UnknownFormat {
    /// The name given.
    pub name: String,
}

impl std::str::FromStr for Format {
    type Err = UnknownFormat;
    fn from_str(s: &str) -> Result<Format, UnknownFormat> {
        Ok(match s {
            "term" => Format::Term,
            "md" | "markdown" => Format::Markdown,
            "latex" | "tex" => Format::Latex,
            "csv" => Format::Csv,
            "json" => Format::Json,
            _ => return Err(UnknownFormat { name: s.into() }),
        })
    }
}

/// Several tables in one output: one JSON array of `{title, rows}` for JSON (a single table as
/// its rows alone), else each table rendered, separated by a blank line.
pub fn render_all(tables: &[Table], format: Format) -> String {
    if format == Format::Json && tables.len() > 1 {
        let all: Vec<serde_json::Value> = tables
            .iter()
            .map(|t| serde_json::json!({ "title": t.title, "rows": json(t) }))
            .collect();
        return serde_json::to_string_pretty(&all).expect("JSON values serialize") + "\n";
    }
    tables
        .iter()
        .map(|t| render(t, format))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Renders a table.
pub fn render(t: &Table, format: Format) -> String {
    match format {
        Format::Term => term(t),
        Format::Markdown => markdown(t),
        Format::Latex => latex(t),
        Format::Csv => csv(t),
        Format::Json => {
            serde_json::to_string_pretty(&json(t)).expect("JSON values serialize") + "\n"
        }
    }
}

fn widths(t: &Table) -> Vec<usize> {
    t.columns
        .iter()
        .enumerate()
        .map(|(i, c)| {
            t.rows
                .iter()
                .map(|r| r[i].plain().chars().count())
                .chain([c.header.chars().count()])
                .max()
                .unwrap_or(0)
        })
        .collect()
}

fn term(t: &Table) -> String {
    let w = widths(t);
    let line = |cells: Vec<(String, bool)>| -> String {
        let parts: Vec<String> = cells
            .iter()
            .zip(&w)
            .map(|((s, right), w)| {
                if *right {
                    format!("{s:>w$}")
                } else {
                    format!("{s:<w$}")
                }
            })
            .collect();
        parts.join("  ").trim_end().to_string()
    };
    let mut out = String::new();
    if !t.title.is_empty() {
        let _ = writeln!(out, "{}", t.title);
    }
    let numeric: Vec<bool> = (0..t.columns.len())
        .map(|i| t.rows.iter().any(|r| r[i].is_numeric()))
        .collect();
    let _ = writeln!(
        out,
        "{}",
        line(
            t.columns
                .iter()
                .zip(&numeric)
                .map(|(c, n)| (c.header.clone(), *n))
                .collect()
        )
    );
    let _ = writeln!(
        out,
        "{}",
        w.iter()
            .map(|w| "-".repeat(*w))
            .collect::<Vec<_>>()
            .join("  ")
    );
    for r in &t.rows {
        let _ = writeln!(
            out,
            "{}",
            line(r.iter().map(|c| (c.plain(), c.is_numeric())).collect())
        );
    }
    if let Some(n) = &t.note {
        let _ = writeln!(out, "{n}");
    }
    out
}

fn markdown(t: &Table) -> String {
    let esc = |s: &str| s.replace('|', "\\|");
    let mut out = String::new();
    if !t.title.is_empty() {
        let _ = writeln!(out, "**{}**\n", esc(&t.title));
    }
    let _ = writeln!(
        out,
        "| {} |",
        t.columns
            .iter()
            .map(|c| esc(&c.header))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    let numeric: Vec<bool> = (0..t.columns.len())
        .map(|i| t.rows.iter().any(|r| r[i].is_numeric()))
        .collect();
    let _ = writeln!(
        out,
        "|{}|",
        numeric
            .iter()
            .map(|n| if *n { "---:" } else { ":---" })
            .collect::<Vec<_>>()
            .join("|")
    );
    for r in &t.rows {
        let _ = writeln!(
            out,
            "| {} |",
            r.iter()
                .map(|c| esc(&c.plain()))
                .collect::<Vec<_>>()
                .join(" | ")
        );
    }
    if let Some(n) = &t.note {
        let _ = writeln!(out, "\n{}", esc(n));
    }
    out
}

fn latex_escape(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        match c {
            '&' | '%' | '$' | '#' | '_' | '{' | '}' => {
                out.push('\\');
                out.push(c);
            }
            '~' => out.push_str("\\textasciitilde{}"),
            '^' => out.push_str("\\textasciicircum{}"),
            '\\' => out.push_str("\\textbackslash{}"),
            c => out.push(c),
        }
    }
    out
}

fn latex(t: &Table) -> String {
    let numeric: Vec<bool> = (0..t.columns.len())
        .map(|i| t.rows.iter().any(|r| r[i].is_numeric()))
        .collect();
    let spec: String = numeric.iter().map(|n| if *n { 'r' } else { 'l' }).collect();
    let mut out = String::new();
    let _ = writeln!(out, "% requires \\usepackage{{booktabs}}");
    let _ = writeln!(out, "\\begin{{table}}[t]\n\\centering");
    if !t.title.is_empty() {
        let _ = writeln!(out, "\\caption{{{}}}", latex_escape(&t.title));
    }
    let _ = writeln!(out, "\\begin{{tabular}}{{{spec}}}\n\\toprule");
    let _ = writeln!(
        out,
        "{} \\\\\n\\midrule",
        t.columns
            .iter()
            .map(|c| latex_escape(&c.header))
            .collect::<Vec<_>>()
            .join(" & ")
    );
    for r in &t.rows {
        let _ = writeln!(
            out,
            "{} \\\\",
            r.iter().map(Cell::latex).collect::<Vec<_>>().join(" & ")
        );
    }
    let _ = writeln!(out, "\\bottomrule\n\\end{{tabular}}");
    if let Some(n) = &t.note {
        let _ = writeln!(out, "\\\\[2pt]{{\\footnotesize {}}}", latex_escape(n));
    }
    let _ = writeln!(out, "\\end{{table}}");
    out
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn csv(t: &Table) -> String {
    let mut header: Vec<String> = Vec::new();
    for (i, c) in t.columns.iter().enumerate() {
        header.push(c.key.clone());
        if t.rows
            .iter()
            .any(|r| matches!(r[i], Cell::MeanStd { std: Some(_), .. }))
        {
            header.push(format!("{}_std", c.key));
        }
    }
    let mut out = header.join(",") + "\n";
    for r in &t.rows {
        let mut fields = Vec::new();
        for (i, cell) in r.iter().enumerate() {
            let has_std = t
                .rows
                .iter()
                .any(|r| matches!(r[i], Cell::MeanStd { std: Some(_), .. }));
            match cell {
                Cell::Text(s) => fields.push(csv_field(s)),
                Cell::Int(n) => fields.push(n.to_string()),
                Cell::Num { value, .. } => fields.push(value.to_string()),
                Cell::MeanStd { mean, std, .. } => {
                    fields.push(mean.to_string());
                    if has_std {
                        fields.push(std.map(|s| s.to_string()).unwrap_or_default());
                    }
                }
                Cell::Empty => {
                    fields.push(String::new());
                    if has_std {
                        fields.push(String::new());
                    }
                }
            }
        }
        out.push_str(&fields.join(","));
        out.push('\n');
    }
    out
}

/// The table as JSON: an array of objects keyed by the columns' snake_case keys.
pub fn json(t: &Table) -> serde_json::Value {
    let rows = t
        .rows
        .iter()
        .map(|r| {
            let mut obj = serde_json::Map::new();
            for (c, cell) in t.columns.iter().zip(r) {
                let v = match cell {
                    Cell::Text(s) => serde_json::Value::from(s.clone()),
                    Cell::Int(n) => serde_json::Value::from(*n),
                    Cell::Num { value, .. } => serde_json::Value::from(*value),
                    Cell::MeanStd { mean, std, .. } => {
                        if let Some(s) = std {
                            obj.insert(format!("{}_std", c.key), serde_json::Value::from(*s));
                        }
                        serde_json::Value::from(*mean)
                    }
                    Cell::Empty => serde_json::Value::Null,
                };
                obj.insert(c.key.clone(), v);
            }
            serde_json::Value::Object(obj)
        })
        .collect();
    serde_json::Value::Array(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Table {
        let mut t = Table::new(
            "Main results",
            &[
                ("method", "Method"),
                ("success_rate_pct", "SR (%)"),
                ("solved", "Solved"),
            ],
        );
        t.push(vec![
            Cell::text("ours_1"),
            Cell::MeanStd {
                mean: 58.43,
                std: Some(1.2),
                decimals: 2,
            },
            Cell::Int(3),
        ]);
        t.push(vec![
            Cell::text("base,line"),
            Cell::num(f64::NAN, 1),
            Cell::Int(1),
        ]);
        t
    }

    #[test]
    fn renders_every_format() {
        let t = sample();
        let term = render(&t, Format::Term);
        assert!(term.contains("58.43 ± 1.20"), "{term}");
        assert!(term.lines().nth(4).unwrap().contains("  -"), "{term}");
        let md = render(&t, Format::Markdown);
        assert!(
            md.contains("| Method | SR (%) | Solved |") && md.contains("|:---|---:|---:|"),
            "{md}"
        );
        let tex = render(&t, Format::Latex);
        assert!(
            tex.contains("\\toprule") && tex.contains("ours\\_1 & 58.43 $\\pm$ 1.20 & 3 \\\\"),
            "{tex}"
        );
        let csv = render(&t, Format::Csv);
        assert_eq!(
            csv.lines().next().unwrap(),
            "method,success_rate_pct,success_rate_pct_std,solved"
        );
        assert!(csv.contains("\"base,line\",,,1"), "{csv}");
        let j = json(&t);
        assert_eq!(j[0]["success_rate_pct"], 58.43);
        assert_eq!(j[0]["success_rate_pct_std"], 1.2);
        assert_eq!(j[1]["success_rate_pct"], serde_json::Value::Null);
        assert_eq!("md".parse::<Format>(), Ok(Format::Markdown));
        assert_eq!(
            "pdf".parse::<Format>().unwrap_err().to_string(),
            "unknown format `pdf`; use term, md, latex, csv or json"
        );
    }
}
