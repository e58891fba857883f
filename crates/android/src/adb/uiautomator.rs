//! Parses `uiautomator dump` XML into a [`Hierarchy`] (pure; no IO).
//!
//! The dump is a flat XML dialect: an optional `<?xml ...?>` prolog, one `<hierarchy>` element
//! and nested `<node .../>` elements whose attributes are all strings. A small hand parser
//! is enough; it tolerates missing attributes and trailing text such as the
//! `UI hierchary dumped to: /dev/tty` line `exec-out uiautomator dump /dev/tty` appends.

use crate::device::{Bounds, Hierarchy, Widget};

/// Why a dump could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DumpError {
    /// uiautomator printed an error instead of XML (e.g. `ERROR: could not get idle state.`).
    #[error(
        "uiautomator returned no hierarchy: {0:?} (the screen may be animating or the device busy; retry after a short wait)"
    )]
    NotXml(String),
    /// The XML is malformed.
    #[error("malformed uiautomator XML at byte {at}: {what}")]
    Malformed {
        /// Byte offset.
        at: usize,
        /// What went wrong.
        what: String,
    },
}

/// Parses a uiautomator dump (XML text, possibly followed by the "dumped to" line).
pub fn parse_dump(text: &str) -> Result<Hierarchy, DumpError> {
    let Some(start) = text.find("<hierarchy") else {
        let first = text.trim().lines().next().unwrap_or("").trim();
        return Err(DumpError::NotXml(if first.is_empty() {
            "empty output".to_string()
        } else {
            first.to_string()
        }));
    };
    let mut p = Parser {
        s: text,
        pos: start,
    };
    // The <hierarchy ...> tag itself.
    let (name, _, self_closing) = p.open_tag()?;
    if name != "hierarchy" {
        return Err(p.err("expected <hierarchy>"));
    }
    if self_closing {
        return Ok(Hierarchy::default());
    }
    let roots = p.children("hierarchy")?;
    Ok(Hierarchy { roots })
}

/// The screen rotation (0–3) from the `<hierarchy rotation="N">` tag, if present.
pub fn parse_rotation(text: &str) -> Option<u8> {
    let start = text.find("<hierarchy")?;
    let tag = &text[start..start + text[start..].find('>')?];
    let at = tag.find("rotation=\"")? + "rotation=\"".len();
    let end = tag[at..].find('"')?;
    tag[at..at + end].parse().ok().filter(|r| *r < 4)
}

/// Parses `[left,top][right,bottom]`.
pub fn parse_bounds(s: &str) -> Option<Bounds> {
    let nums: Vec<i32> = s
        .split(['[', ']', ','])
        .filter(|p| !p.is_empty())
        .map(|p| p.trim().parse().ok())
        .collect::<Option<Vec<_>>>()?;
    match nums[..] {
        [left, top, right, bottom] => Some(Bounds {
            left,
            top,
            right,
            bottom,
        }),
        _ => None,
    }
}

/// Decodes the five predefined XML entities and numeric character references.
pub fn unescape(s: &str) -> String {
    if !s.contains('&') {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('&') {
        out.push_str(&rest[..i]);
        rest = &rest[i..];
        let Some(end) = rest.find(';').filter(|&e| e <= 12) else {
            out.push('&');
            rest = &rest[1..];
            continue;
        };
        let ent = &rest[1..end];
        let decoded = match ent {
            "amp" => Some('&'),
            "lt" => Some('<'),
            "gt" => Some('>'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            _ if ent.starts_with("#x") || ent.starts_with("#X") => {
                u32::from_str_radix(&ent[2..], 16)
                    .ok()
                    .and_then(char::from_u32)
            }
            _ if ent.starts_with('#') => ent[1..].parse().ok().and_then(char::from_u32),
            _ => None,
        };
        match decoded {
            Some(c) => {
                out.push(c);
                rest = &rest[end + 1..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

fn widget_from(attrs: &[(String, String)]) -> Widget {
    let get = |k: &str| {
        attrs
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
            .unwrap_or("")
    };
    let flag = |k: &str| get(k) == "true";
    Widget {
        class: get("class").to_string(),
        resource_id: get("resource-id").to_string(),
        text: get("text").to_string(),
        content_desc: get("content-desc").to_string(),
        hint: get("hint").to_string(),
        package: get("package").to_string(),
        bounds: parse_bounds(get("bounds")).unwrap_or_default(),
        clickable: flag("clickable"),
        long_clickable: flag("long-clickable"),
        checkable: flag("checkable"),
        checked: flag("checked"),
        scrollable: flag("scrollable"),
        // Absent `enabled` means enabled (older dumps omit nothing, but be lenient).
        enabled: get("enabled") != "false",
        focused: flag("focused"),
        children: Vec::new(),
    }
}

struct Parser<'a> {
    s: &'a str,
    pos: usize,
}

type Tag = (String, Vec<(String, String)>, bool);

impl Parser<'_> {
    fn err(&self, what: &str) -> DumpError {
        DumpError::Malformed {
            at: self.pos,
            what: what.to_string(),
        }
    }

    fn rest(&self) -> &str {
        &self.s[self.pos..]
    }

    fn skip_ws(&mut self) {
        let r = self.rest();
        self.pos += r.len() - r.trim_start().len();
    }

    /// Parses `<name attr="v" ...>` or `.../>` at the cursor.
    fn open_tag(&mut self) -> Result<Tag, DumpError> {
        if !self.rest().starts_with('<') {
            return Err(self.err("expected '<'"));
        }
        self.pos += 1;
        let name_len = self
            .rest()
            .find(|c: char| c.is_whitespace() || c == '>' || c == '/')
            .ok_or_else(|| self.err("unterminated tag"))?;
        let name = self.rest()[..name_len].to_string();
        self.pos += name_len;
        let mut attrs = Vec::new();
        loop {
            self.skip_ws();
            let r = self.rest();
            if r.starts_with("/>") {
                self.pos += 2;
                return Ok((name, attrs, true));
            }
            if r.starts_with('>') {
                self.pos += 1;
                return Ok((name, attrs, false));
            }
            if r.is_empty() {
                return Err(self.err("unterminated tag"));
            }
            let eq = r
                .find('=')
                .ok_or_else(|| self.err("attribute without '='"))?;
            let key = r[..eq].trim().to_string();
            if key.is_empty() || key.contains(|c: char| c.is_whitespace() || c == '<' || c == '>') {
                return Err(self.err("bad attribute name"));
            }
            self.pos += eq + 1;
            self.skip_ws();
            let quote = self
                .rest()
                .chars()
                .next()
                .filter(|&c| c == '"' || c == '\'')
                .ok_or_else(|| self.err("attribute value not quoted"))?;
            self.pos += 1;
            let end = self
                .rest()
                .find(quote)
                .ok_or_else(|| self.err("unterminated attribute value"))?;
            let value = unescape(&self.rest()[..end]);
            self.pos += end + 1;
            attrs.push((key, value));
        }
    }

    /// Parses child `<node>`s up to `</parent>`.
    fn children(&mut self, parent: &str) -> Result<Vec<Widget>, DumpError> {
        let mut out = Vec::new();
        loop {
            // Skip text content between tags (uiautomator emits none, but whitespace is common).
            let lt = self
                .rest()
                .find('<')
                .ok_or_else(|| self.err(&format!("missing </{parent}>")))?;
            self.pos += lt;
            if self.rest().starts_with("</") {
                let close = format!("</{parent}");
                if !self.rest().starts_with(&close) {
                    return Err(self.err(&format!("mismatched close tag, expected </{parent}>")));
                }
                let gt = self
                    .rest()
                    .find('>')
                    .ok_or_else(|| self.err("unterminated close tag"))?;
                self.pos += gt + 1;
                return Ok(out);
            }
            if self.rest().starts_with("<!--") {
                let end = self
                    .rest()
                    .find("-->")
                    .ok_or_else(|| self.err("unterminated comment"))?;
                self.pos += end + 3;
                continue;
            }
            let (name, attrs, self_closing) = self.open_tag()?;
            let mut w = widget_from(&attrs);
            if !self_closing {
                w.children = self.children(&name)?;
            }
            if name == "node" {
                out.push(w);
            } else {
                // Unknown element: keep its node children in place.
                out.extend(w.children);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adb::fixture;

    #[test]
    fn parses_recorded_dump() {
        let h = parse_dump(&fixture("uiautomator_notes.xml")).unwrap();
        assert_eq!(h.roots.len(), 1);
        let all = h.widgets();
        assert_eq!(all.len(), 10);
        let save = all
            .iter()
            .find(|w| w.resource_id == "com.example.notes:id/save")
            .unwrap();
        assert_eq!(save.class, "android.widget.Button");
        assert_eq!(save.text, "Save & close");
        assert!(save.clickable && save.enabled);
        assert_eq!(
            save.bounds,
            Bounds {
                left: 42,
                top: 1610,
                right: 1038,
                bottom: 1736
            }
        );
        let title = all.iter().find(|w| w.is_text_field()).unwrap();
        assert_eq!(title.hint, "Title");
        assert_eq!(title.text, "<b>\"Groceries\"</b>");
        assert!(title.focused);
        let toggle = all
            .iter()
            .find(|w| w.class == "android.widget.Switch")
            .unwrap();
        assert!(toggle.checkable && toggle.checked);
        assert!(!all.iter().find(|w| w.text == "Disabled").unwrap().enabled);
    }

    #[test]
    fn tolerates_missing_attributes_and_trailer() {
        let x = "<?xml version='1.0' encoding='UTF-8' standalone='yes' ?><hierarchy rotation=\"1\"><node class=\"a.B\"><node text=\"x&#233;&#x41;\" /></node></hierarchy>UI hierchary dumped to: /dev/tty\n";
        let h = parse_dump(x).unwrap();
        assert_eq!(h.roots[0].class, "a.B");
        let child = &h.roots[0].children[0];
        assert_eq!(child.text, "xéA");
        assert_eq!(child.bounds, Bounds::default());
        assert!(child.enabled);
        assert_eq!(parse_rotation(x), Some(1));
        assert_eq!(parse_rotation(&fixture("uiautomator_notes.xml")), Some(0));
        assert_eq!(parse_rotation("<hierarchy>"), None);
    }

    #[test]
    fn errors_are_clear() {
        let e = parse_dump(&fixture("uiautomator_idle_error.txt")).unwrap_err();
        assert!(matches!(&e, DumpError::NotXml(m) if m.contains("could not get idle state")));
        assert!(e.to_string().contains("retry"));
        assert!(matches!(
            parse_dump("<hierarchy><node text=\"a\">"),
            Err(DumpError::Malformed { .. })
        ));
        assert!(matches!(
            parse_dump("<hierarchy><node text=a /></hierarchy>"),
            Err(DumpError::Malformed { .. })
        ));
        assert!(matches!(parse_dump(""), Err(DumpError::NotXml(_))));
    }

    #[test]
    fn bounds_and_entities() {
        assert_eq!(
            parse_bounds("[0,63][1080,2274]"),
            Some(Bounds {
                left: 0,
                top: 63,
                right: 1080,
                bottom: 2274
            })
        );
        assert_eq!(parse_bounds("[0,63]"), None);
        assert_eq!(unescape("a &amp; b &lt; &bogus; &"), "a & b < &bogus; &");
    }
}
