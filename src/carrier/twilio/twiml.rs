//! TwiML answer documents patterd returns to Twilio's voice webhook: `<Connect><Stream>` to
//! bridge the call to our media socket, `<Reject>` to refuse without answering, and
//! `<Hangup>` (optionally after `<Say>`). All text is XML-escaped.

const XML_DECL: &str = r#"<?xml version="1.0" encoding="UTF-8"?>"#;

pub(crate) use crate::carrier::codec_util::xml_escape;

/// `<Connect><Stream url=..>` with one `<Parameter>` per pair (they arrive in the media
/// socket's `start.customParameters`) and an optional stream status callback (POST).
/// `stream_url` must be an absolute `wss://` URL without a query string (Twilio drops it).
pub fn twiml_connect_stream(
    stream_url: &str,
    params: &[(&str, &str)],
    status_callback: Option<&str>,
) -> String {
    let mut s = String::with_capacity(256);
    s.push_str(XML_DECL);
    s.push_str("<Response><Connect><Stream url=\"");
    s.push_str(&xml_escape(stream_url));
    s.push('"');
    if let Some(cb) = status_callback {
        s.push_str(" statusCallback=\"");
        s.push_str(&xml_escape(cb));
        s.push_str("\" statusCallbackMethod=\"POST\"");
    }
    s.push('>');
    for (name, value) in params {
        s.push_str("<Parameter name=\"");
        s.push_str(&xml_escape(name));
        s.push_str("\" value=\"");
        s.push_str(&xml_escape(value));
        s.push_str("\"/>");
    }
    s.push_str("</Stream></Connect></Response>");
    s
}

/// `<Reject/>`: refuse the call without answering it (the caller is not billed). `reason` may be
/// `busy` or `rejected`; anything else is left out (Twilio then plays its default).
pub fn twiml_reject(reason: Option<&str>) -> String {
    match reason {
        Some(r @ ("busy" | "rejected")) => {
            format!("{XML_DECL}<Response><Reject reason=\"{r}\"/></Response>")
        }
        _ => format!("{XML_DECL}<Response><Reject/></Response>"),
    }
}

/// `<Dial>`: the cold transfer of a live call, sent inline as the call
/// update's `Twiml`. No `action`: when the dialled leg ends, the document runs out and the
/// caller's leg hangs up.
pub(crate) fn twiml_dial(to: &str, caller_id: &str, timeout_s: u32) -> String {
    format!(
        "{XML_DECL}<Response><Dial callerId=\"{}\" timeout=\"{timeout_s}\" \
         answerOnBridge=\"true\">{}</Dial></Response>",
        xml_escape(caller_id),
        xml_escape(to)
    )
}

/// `<Hangup/>`: end the call.
pub fn twiml_hangup() -> String {
    format!("{XML_DECL}<Response><Hangup/></Response>")
}

/// `<Say>text</Say><Hangup/>`: answer, speak a short message, end the call.
pub fn twiml_say_hangup(text: &str) -> String {
    format!(
        "{XML_DECL}<Response><Say>{}</Say><Hangup/></Response>",
        xml_escape(text)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_stream_escapes() {
        let x = twiml_connect_stream("wss://h/m", &[("token", "a\"<&>'b")], None);
        assert_eq!(
            x,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Response><Connect><Stream url=\"wss://h/m\">\
             <Parameter name=\"token\" value=\"a&quot;&lt;&amp;&gt;&apos;b\"/></Stream></Connect></Response>"
        );
    }

    #[test]
    fn reject_and_hangup() {
        assert!(twiml_reject(None).ends_with("<Response><Reject/></Response>"));
        assert!(
            twiml_reject(Some("busy")).ends_with("<Response><Reject reason=\"busy\"/></Response>")
        );
        assert!(twiml_reject(Some("rejected")).contains("reason=\"rejected\""));
        assert!(twiml_reject(Some("x\"y")).ends_with("<Reject/></Response>"));
        assert!(twiml_hangup().ends_with("<Response><Hangup/></Response>"));
        assert!(twiml_say_hangup("a & b").contains("<Say>a &amp; b</Say><Hangup/>"));
    }
}
