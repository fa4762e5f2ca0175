//! Plivo XML answer documents: a bidirectional `<Stream>` whose element text
//! is our media WebSocket URL, and the refusals — `<Hangup reason="busy|rejected"/>` without
//! answering, or `<Speak>` then `<Hangup/>`. All text is XML-escaped.

use crate::carrier::codec_util::xml_escape;

const XML_DECL: &str = r#"<?xml version="1.0" encoding="UTF-8"?>"#;

/// `<Stream bidirectional="true" keepCallAlive="true" contentType=…>ws_url</Stream>`.
pub fn stream_xml(ws_url: &str, content_type: &str) -> String {
    format!(
        "{XML_DECL}<Response><Stream bidirectional=\"true\" keepCallAlive=\"true\" \
         contentType=\"{}\">{}</Stream></Response>",
        xml_escape(content_type),
        xml_escape(ws_url)
    )
}

/// `<Dial callerId timeout><Number>to</Number></Dial>`: the cold transfer Plivo fetches from
/// the transfer's `aleg_url`. No `action`: when the dialled leg ends,
/// the caller's leg hangs up.
pub(crate) fn dial_xml(to: &str, caller_id: &str, timeout_s: u32) -> String {
    format!(
        "{XML_DECL}<Response><Dial callerId=\"{}\" timeout=\"{timeout_s}\">\
         <Number>{}</Number></Dial></Response>",
        xml_escape(caller_id),
        xml_escape(to)
    )
}

/// `<Hangup reason=…/>`: refuse without answering. `reason` may be `busy` or `rejected`;
/// anything else is left out.
pub(crate) fn hangup_xml(reason: Option<&str>) -> String {
    match reason {
        Some(r @ ("busy" | "rejected")) => {
            format!("{XML_DECL}<Response><Hangup reason=\"{r}\"/></Response>")
        }
        _ => format!("{XML_DECL}<Response><Hangup/></Response>"),
    }
}

/// `<Speak>text</Speak><Hangup/>`: answer, say something, end the call.
pub fn speak_hangup_xml(text: &str) -> String {
    format!(
        "{XML_DECL}<Response><Speak>{}</Speak><Hangup/></Response>",
        xml_escape(text)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents() {
        let x = stream_xml("wss://h/plivo/media/c?t=a&b", "audio/x-mulaw;rate=8000");
        assert!(
            x.contains(">wss://h/plivo/media/c?t=a&amp;b</Stream>"),
            "{x}"
        );
        assert!(hangup_xml(Some("busy")).contains("<Hangup reason=\"busy\"/>"));
        assert!(hangup_xml(Some("x\"")).contains("<Hangup/>"));
        assert!(speak_hangup_xml("a<b").contains("<Speak>a&lt;b</Speak><Hangup/>"));
    }
}
