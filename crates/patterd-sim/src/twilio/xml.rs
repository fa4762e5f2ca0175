//! A tiny XML reader for the simulator: enough to parse TwiML answers (elements, attributes,
//! text, the five predefined entities and numeric references, comments and the prolog) into a
//! tree, and to pull out what Twilio acts on: `<Connect><Stream url>` with its `<Parameter>`s,
//! `<Reject reason>`, `<Say>` and `<Hangup>`.

use std::collections::BTreeMap;

/// One XML element.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct XmlElement {
    pub name: String,
    /// Attributes in document order.
    pub attrs: Vec<(String, String)>,
    pub children: Vec<XmlElement>,
    /// Concatenated text content (entities decoded), trimmed.
    pub text: String,
}

impl XmlElement {
    pub fn attr(&self, name: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Depth-first iterator over this element and all descendants.
    pub fn descendants(&self) -> Vec<&XmlElement> {
        let mut out = vec![self];
        for c in &self.children {
            out.extend(c.descendants());
        }
        out
    }

    /// A canonical form for structural comparison: attributes sorted.
    pub fn canonical(&self) -> XmlElement {
        let mut attrs = self.attrs.clone();
        attrs.sort();
        XmlElement {
            name: self.name.clone(),
            attrs,
            children: self.children.iter().map(XmlElement::canonical).collect(),
            text: self.text.clone(),
        }
    }
}

struct Parser<'a> {
    s: &'a str,
    pos: usize,
}

impl<'a> Parser<'a> {
    fn rest(&self) -> &'a str {
        &self.s[self.pos..]
    }

    fn skip_ws(&mut self) {
        let r = self.rest();
        self.pos += r.len() - r.trim_start().len();
    }

    fn skip_misc(&mut self) -> Result<(), String> {
        loop {
            self.skip_ws();
            let r = self.rest();
            let end = if r.starts_with("<?") {
                "?>"
            } else if r.starts_with("<!--") {
                "-->"
            } else {
                return Ok(());
            };
            let i = r.find(end).ok_or("unterminated prolog or comment")?;
            self.pos += i + end.len();
        }
    }

    fn name(&mut self) -> Result<String, String> {
        let r = self.rest();
        let n = r
            .find(|c: char| c.is_whitespace() || matches!(c, '/' | '>' | '=' | '<'))
            .unwrap_or(r.len());
        if n == 0 {
            return Err(format!("expected a name at byte {}", self.pos));
        }
        self.pos += n;
        Ok(r[..n].to_string())
    }

    fn element(&mut self, depth: usize) -> Result<XmlElement, String> {
        if depth > 32 {
            return Err("XML nested too deeply".into());
        }
        if !self.rest().starts_with('<') {
            return Err(format!("expected `<` at byte {}", self.pos));
        }
        self.pos += 1;
        let mut el = XmlElement {
            name: self.name()?,
            ..Default::default()
        };
        loop {
            self.skip_ws();
            let r = self.rest();
            if let Some(after) = r.strip_prefix("/>") {
                self.pos = self.s.len() - after.len();
                return Ok(el);
            }
            if r.starts_with('>') {
                self.pos += 1;
                break;
            }
            let key = self.name()?;
            self.skip_ws();
            if !self.rest().starts_with('=') {
                return Err(format!("attribute `{key}` has no value"));
            }
            self.pos += 1;
            self.skip_ws();
            let quote = self
                .rest()
                .chars()
                .next()
                .filter(|c| *c == '"' || *c == '\'')
                .ok_or_else(|| format!("attribute `{key}` is not quoted"))?;
            self.pos += 1;
            let end = self
                .rest()
                .find(quote)
                .ok_or_else(|| format!("attribute `{key}` is not terminated"))?;
            let raw = &self.rest()[..end];
            if raw.contains('<') {
                return Err(format!("`<` inside attribute `{key}`"));
            }
            el.attrs.push((key, unescape(raw)?));
            self.pos += end + 1;
        }
        let mut text = String::new();
        loop {
            let r = self.rest();
            let lt = r
                .find('<')
                .ok_or_else(|| format!("`<{}>` is not closed", el.name))?;
            text.push_str(&unescape(&r[..lt])?);
            self.pos += lt;
            let r = self.rest();
            if r.starts_with("</") {
                self.pos += 2;
                let close = self.name()?;
                if close != el.name {
                    return Err(format!("`<{}>` closed by `</{close}>`", el.name));
                }
                self.skip_ws();
                if !self.rest().starts_with('>') {
                    return Err(format!("bad closing tag `</{close}`"));
                }
                self.pos += 1;
                el.text = text.trim().to_string();
                return Ok(el);
            }
            if r.starts_with("<!--") {
                let i = r.find("-->").ok_or("unterminated comment")?;
                self.pos += i + 3;
                continue;
            }
            el.children.push(self.element(depth + 1)?);
        }
    }
}

fn unescape(s: &str) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('&') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let semi = after.find(';').ok_or("unterminated entity")?;
        let ent = &after[..semi];
        let c = match ent {
            "amp" => '&',
            "lt" => '<',
            "gt" => '>',
            "quot" => '"',
            "apos" => '\'',
            _ => {
                let code = if let Some(h) = ent.strip_prefix("#x").or(ent.strip_prefix("#X")) {
                    u32::from_str_radix(h, 16).ok()
                } else if let Some(d) = ent.strip_prefix('#') {
                    d.parse().ok()
                } else {
                    None
                };
                code.and_then(char::from_u32)
                    .ok_or_else(|| format!("unknown entity `&{ent};`"))?
            }
        };
        out.push(c);
        rest = &after[semi + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Parses a whole XML document into its root element.
pub fn parse_xml(s: &str) -> Result<XmlElement, String> {
    let mut p = Parser { s, pos: 0 };
    p.skip_misc()?;
    let root = p.element(0)?;
    p.skip_misc()?;
    if !p.rest().is_empty() {
        return Err("content after the root element".into());
    }
    Ok(root)
}

/// What a TwiML answer tells Twilio to do.
#[derive(Debug, Clone, Default)]
pub struct TwimlAnswer {
    pub root: XmlElement,
    /// `<Connect><Stream url>` (query string removed, as Twilio does).
    pub stream_url: Option<String>,
    /// `<Parameter>`s of the stream: they become `start.customParameters`.
    pub parameters: BTreeMap<String, String>,
    pub status_callback: Option<String>,
    /// `Some(reason)` for `<Reject>` (`""` when no reason).
    pub reject: Option<String>,
    pub hangup: bool,
    pub say: Vec<String>,
    /// Things real Twilio would silently change or ignore (e.g. a query on the stream URL).
    pub warnings: Vec<String>,
}

/// Parses a TwiML answer. Errors if it is not XML or its root is not `<Response>`.
pub fn parse_twiml(xml: &str) -> Result<TwimlAnswer, String> {
    let root = parse_xml(xml)?;
    if root.name != "Response" {
        return Err(format!("TwiML root is `<{}>`, not `<Response>`", root.name));
    }
    let mut ans = TwimlAnswer::default();
    for verb in &root.children {
        match verb.name.as_str() {
            "Connect" => {
                for noun in &verb.children {
                    if noun.name != "Stream" {
                        ans.warnings
                            .push(format!("unsupported <Connect> noun <{}>", noun.name));
                        continue;
                    }
                    let Some(url) = noun.attr("url") else {
                        ans.warnings.push("<Stream> without url".into());
                        continue;
                    };
                    let url = match url.split_once('?') {
                        Some((u, _)) => {
                            ans.warnings
                                .push("query string on <Stream url> is dropped".into());
                            u.to_string()
                        }
                        None => url.to_string(),
                    };
                    if !url.starts_with("wss://") {
                        ans.warnings
                            .push(format!("<Stream url> is not wss:// ({url})"));
                    }
                    ans.stream_url = Some(url);
                    ans.status_callback = noun.attr("statusCallback").map(str::to_string);
                    for p in &noun.children {
                        match (p.name.as_str(), p.attr("name"), p.attr("value")) {
                            ("Parameter", Some(n), Some(v)) => {
                                ans.parameters.insert(n.to_string(), v.to_string());
                            }
                            _ => ans
                                .warnings
                                .push(format!("bad <Stream> child <{}>", p.name)),
                        }
                    }
                }
            }
            "Reject" => ans.reject = Some(verb.attr("reason").unwrap_or("").to_string()),
            "Hangup" => ans.hangup = true,
            "Say" => ans.say.push(verb.text.clone()),
            other => ans.warnings.push(format!("verb <{other}> not modelled")),
        }
    }
    Ok(ans)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_connect_stream() {
        let x = r#"<?xml version="1.0" encoding="UTF-8"?><Response><Connect><Stream url="wss://h/m" statusCallback="https://h/s"><Parameter name="token" value="a&amp;b&#x41;" /></Stream></Connect></Response>"#;
        let a = parse_twiml(x).expect("valid");
        assert_eq!(a.stream_url.as_deref(), Some("wss://h/m"));
        assert_eq!(a.parameters.get("token").map(String::as_str), Some("a&bA"));
        assert_eq!(a.status_callback.as_deref(), Some("https://h/s"));
        assert!(a.warnings.is_empty());
    }

    #[test]
    fn parses_reject_and_errors() {
        let a = parse_twiml("<Response><Reject reason='busy'/></Response>").expect("valid");
        assert_eq!(a.reject.as_deref(), Some("busy"));
        let a =
            parse_twiml("<Response>\n  <Say>Hi &lt;there&gt;</Say>\n  <Hangup/>\n</Response>\n")
                .expect("valid");
        assert_eq!(a.say, vec!["Hi <there>".to_string()]);
        assert!(a.hangup);
        assert!(parse_twiml("<Response><Say>x</Response>").is_err());
        assert!(parse_twiml("<Foo/>").is_err());
        assert!(parse_twiml("").is_err());
        assert!(parse_twiml("<Response a=b/>").is_err());
        assert!(parse_twiml("<Response>&bogus;</Response>").is_err());
        assert!(parse_twiml("<Response/><x/>").is_err());
    }
}
