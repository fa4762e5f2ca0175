//! Twilio number administration: the credential check
//! `GET Accounts/{AccountSid}.json` (its body holds the auth token: only `status` and `type`
//! are read), the number's `IncomingPhoneNumbers` instance found by exact `phone_number`, and
//! the `VoiceUrl` + `StatusCallback` update and its exact restore. A number on a SIP trunk is
//! refused; a TwiML app (`VoiceApplicationSid`) is detached and restored.

use serde_json::{Value, json};

use super::rest::{TwilioRest, encode_form};
use crate::carrier::CarrierError;
use crate::carrier::admin::{
    AdminRequest, NumberAdmin, Wiring, bad_record, send_with, str_field,
};
use crate::carrier::registry::BoxFuture;
use crate::carrier::webhook::public_request_url;

const CARRIER: &str = "Twilio";

/// The fields saved before a change and restored by `unwire`.
const SAVED: &[&str] = &[
    "sid",
    "phone_number",
    "voice_url",
    "voice_method",
    "status_callback",
    "status_callback_method",
    "voice_application_sid",
    "trunk_sid",
];

/// [`NumberAdmin`] for one Twilio account.
pub(crate) struct TwilioNumbers(pub TwilioRest);

impl TwilioNumbers {
    fn account_url(&self) -> String {
        format!("{}/2010-04-01/Accounts/{}", self.0.base, self.0.account_sid)
    }

    fn number_url(&self, sid: &str) -> String {
        format!("{}/IncomingPhoneNumbers/{sid}.json", self.account_url())
    }
}

fn sid_of(saved: &Value) -> Result<String, CarrierError> {
    let sid = str_field(saved, "sid");
    if sid.starts_with("PN") && sid.bytes().all(|b| b.is_ascii_alphanumeric()) {
        Ok(sid)
    } else {
        Err(bad_record(CARRIER))
    }
}

impl NumberAdmin for TwilioNumbers {
    fn check_credentials(&self) -> BoxFuture<Result<String, CarrierError>> {
        let url = format!("{}.json", self.account_url());
        let rest = self.0.clone();
        Box::pin(async move {
            let v = send_with(
                &rest.client,
                CARRIER,
                &rest.base,
                &rest.authorization(),
                &AdminRequest::get(url),
            )
            .await?;
            // Never keep or print the body: it contains the auth token.
            let status = str_field(&v, "status");
            let kind = str_field(&v, "type");
            if !status.is_empty() && status != "active" {
                return Err(CarrierError::Config {
                    carrier: CARRIER,
                    message: format!("the account is {status}, not active"),
                });
            }
            Ok(format!("account {} ({status}, {kind})", rest.account_sid))
        })
    }

    fn inbound_url(&self, public_url: &str) -> String {
        public_request_url(public_url, "/twilio/voice", None)
    }

    fn read_wiring(&self, number: &str) -> BoxFuture<Result<Wiring, CarrierError>> {
        let query = encode_form(&[("PhoneNumber", number)]);
        let url = format!("{}/IncomingPhoneNumbers.json?{query}", self.account_url());
        let rest = self.0.clone();
        let number = number.to_string();
        Box::pin(async move {
            let v = send_with(
                &rest.client,
                CARRIER,
                &rest.base,
                &rest.authorization(),
                &AdminRequest::get(url),
            )
            .await?;
            let found = v
                .get("incoming_phone_numbers")
                .and_then(Value::as_array)
                .and_then(|list| {
                    list.iter()
                        .find(|n| n.get("phone_number").and_then(Value::as_str) == Some(&number))
                })
                .ok_or_else(|| CarrierError::NotFound {
                    carrier: CARRIER,
                    what: format!(
                        "the number {} on account {}",
                        crate::security::mask_number(&number),
                        rest.account_sid
                    ),
                })?;
            let saved: serde_json::Map<String, Value> = SAVED
                .iter()
                .map(|k| ((*k).to_string(), json!(str_field(found, k))))
                .collect();
            let saved = Value::Object(saved);
            sid_of(&saved)?;
            let app = str_field(&saved, "voice_application_sid");
            let trunk = str_field(&saved, "trunk_sid");
            let voice = str_field(&saved, "voice_url");
            let (voice_url, describe) = if !trunk.is_empty() {
                (None, format!("SIP trunk {trunk}"))
            } else if !app.is_empty() {
                (None, format!("TwiML app {app}"))
            } else if voice.is_empty() {
                (None, "no VoiceUrl".to_string())
            } else {
                (Some(voice.clone()), format!("VoiceUrl {voice}"))
            };
            Ok(Wiring {
                app: None,
                number,
                voice_url,
                describe,
                saved,
            })
        })
    }

    fn wire_plan(
        &self,
        current: &Wiring,
        public_url: &str,
    ) -> Result<Vec<AdminRequest>, CarrierError> {
        let sid = sid_of(&current.saved)?;
        let trunk = str_field(&current.saved, "trunk_sid");
        if !trunk.is_empty() {
            return Err(CarrierError::Config {
                carrier: CARRIER,
                message: format!(
                    "the number routes to SIP trunk {trunk}; patterd does not rewire trunk \
                     numbers (detach it from the trunk in the console first)"
                ),
            });
        }
        let voice = self.inbound_url(public_url);
        let status = public_request_url(public_url, "/twilio/status", None);
        let mut fields = vec![
            ("VoiceUrl", voice.as_str()),
            ("VoiceMethod", "POST"),
            ("StatusCallback", status.as_str()),
            ("StatusCallbackMethod", "POST"),
        ];
        if !str_field(&current.saved, "voice_application_sid").is_empty() {
            // An application overrides the voice URLs: detach it (restored by unwire).
            fields.push(("VoiceApplicationSid", ""));
        }
        Ok(vec![AdminRequest::form(
            self.number_url(&sid),
            encode_form(&fields),
        )])
    }

    fn restore_plan(&self, previous: &Wiring) -> Result<Vec<AdminRequest>, CarrierError> {
        let s = &previous.saved;
        let sid = sid_of(s)?;
        let (voice, voice_method) = (str_field(s, "voice_url"), str_field(s, "voice_method"));
        let (status, status_method) = (
            str_field(s, "status_callback"),
            str_field(s, "status_callback_method"),
        );
        let app = str_field(s, "voice_application_sid");
        let mut fields = vec![("VoiceUrl", voice.as_str())];
        if !voice_method.is_empty() {
            fields.push(("VoiceMethod", voice_method.as_str()));
        }
        fields.push(("StatusCallback", status.as_str()));
        if !status_method.is_empty() {
            fields.push(("StatusCallbackMethod", status_method.as_str()));
        }
        if !app.is_empty() {
            fields.push(("VoiceApplicationSid", app.as_str()));
        }
        Ok(vec![AdminRequest::form(
            self.number_url(&sid),
            encode_form(&fields),
        )])
    }

    fn send(&self, req: AdminRequest) -> BoxFuture<Result<Value, CarrierError>> {
        let rest = self.0.clone();
        Box::pin(async move {
            send_with(
                &rest.client,
                CARRIER,
                &rest.base,
                &rest.authorization(),
                &req,
            )
            .await
        })
    }
}

/// The number administration of a `kind = "twilio"` account.
pub fn admin(cfg: &super::Config) -> Result<Box<dyn NumberAdmin>, CarrierError> {
    Ok(Box::new(TwilioNumbers(TwilioRest::from_config(cfg)?)))
}
