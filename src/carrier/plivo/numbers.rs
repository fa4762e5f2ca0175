//! Plivo number administration: the credential check `GET` on
//! `/v1/Account/{auth_id}/` itself; a number (`Number/{digits}/`) routes to the application
//! named by its `application` URI, whose `answer_url` is where calls arrive. Wiring updates
//! that application's answer and hangup URLs and methods — only those four fields, so Plivo's
//! SDK defaults never reset the others — and unwire puts the four saved values back once no
//! other number wired by patterd uses the application (they are kept once per application).
//! A number without an application is refused: Plivo cannot return a number to "no
//! application". The other numbers on an application are found in the account's number list
//! (`Number/`, 20 a page; Plivo has no filter by application).

use serde_json::{Value, json};

use super::rest::PlivoRest;
use crate::carrier::CarrierError;
use crate::carrier::admin::{
    AdminMethod, AdminRequest, NumberAdmin, SharedApp, Wiring, bad_record, send_with, str_field,
};
use crate::carrier::registry::BoxFuture;
use crate::carrier::rest_client::path_safe;
use crate::carrier::webhook::public_request_url;

const CARRIER: &str = "Plivo";

/// The application fields wiring changes and unwire restores.
const APP_FIELDS: &[&str] = &["answer_url", "answer_method", "hangup_url", "hangup_method"];

/// Plivo's largest page of numbers, and the most pages read for the shared-application check.
const PAGE_SIZE: usize = 20;
const MAX_PAGES: usize = 100;

/// [`NumberAdmin`] for one Plivo account.
pub(crate) struct PlivoNumbers(pub PlivoRest);

impl PlivoNumbers {
    fn account_url(&self) -> String {
        format!("{}/v1/Account/{}/", self.0.base, self.0.auth_id)
    }

    fn app_url(&self, app_id: &str) -> String {
        format!("{}Application/{app_id}/", self.account_url())
    }

    async fn get(&self, url: String) -> Result<Value, CarrierError> {
        send_with(
            &self.0.client,
            CARRIER,
            &self.0.base,
            &self.0.authorization(),
            &AdminRequest::get(url),
        )
        .await
    }

    async fn read(&self, number: String) -> Result<Wiring, CarrierError> {
        let digits: String = number.chars().filter(char::is_ascii_digit).collect();
        let v = self
            .get(format!("{}Number/{digits}/", self.account_url()))
            .await
            .map_err(|e| match e {
                CarrierError::Http { status: 404, .. } => CarrierError::NotFound {
                    carrier: CARRIER,
                    what: format!(
                        "the number {} on this account",
                        crate::security::mask_number(&number)
                    ),
                },
                e => e,
            })?;
        let app_id = v
            .get("application")
            .and_then(Value::as_str)
            .and_then(|uri| uri.trim_end_matches('/').rsplit('/').next())
            .unwrap_or_default()
            .to_string();
        if app_id.is_empty() {
            return Ok(Wiring {
                number,
                voice_url: None,
                describe: "no application".into(),
                saved: json!({"app_id": ""}),
                app: None,
            });
        }
        if !path_safe(&app_id) {
            return Err(bad_record(CARRIER));
        }
        let app = self.get(self.app_url(&app_id)).await?;
        let mut saved = serde_json::Map::new();
        saved.insert("app_id".into(), json!(app_id));
        for k in APP_FIELDS {
            saved.insert((*k).into(), json!(str_field(&app, k)));
        }
        let answer = str_field(&app, "answer_url");
        let saved = Value::Object(saved);
        Ok(Wiring {
            number,
            voice_url: (!answer.is_empty()).then(|| answer.clone()),
            describe: format!("application {app_id} → {answer}"),
            app: Some(SharedApp {
                id: app_id,
                voice_url: answer,
                saved: saved.clone(),
            }),
            saved,
        })
    }

    /// The account's numbers whose `application` is `app_id` (E.164).
    async fn numbers_on(&self, app_id: &str) -> Result<Vec<String>, CarrierError> {
        let mut out = Vec::new();
        for page in 0..MAX_PAGES {
            let url = format!(
                "{}Number/?limit={PAGE_SIZE}&offset={}",
                self.account_url(),
                page * PAGE_SIZE
            );
            let v = self.get(url).await?;
            let objects = v
                .get("objects")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            for n in &objects {
                let app = n
                    .get("application")
                    .and_then(Value::as_str)
                    .and_then(|uri| uri.trim_end_matches('/').rsplit('/').next())
                    .unwrap_or_default();
                let digits = str_field(n, "number");
                if app == app_id && !digits.is_empty() {
                    out.push(format!("+{}", digits.trim_start_matches('+')));
                }
            }
            let next = v.pointer("/meta/next").and_then(Value::as_str);
            if objects.len() < PAGE_SIZE || next.is_none_or(str::is_empty) {
                break;
            }
        }
        Ok(out)
    }

    fn app_restore(&self, s: &Value) -> Result<Vec<AdminRequest>, CarrierError> {
        let app_id = Self::app_id(s)?;
        let body: serde_json::Map<String, Value> = APP_FIELDS
            .iter()
            .map(|k| ((*k).to_string(), json!(str_field(s, k))))
            .collect();
        Ok(vec![AdminRequest::json(
            AdminMethod::Post,
            self.app_url(&app_id),
            &Value::Object(body),
        )])
    }

    fn app_id(saved: &Value) -> Result<String, CarrierError> {
        let id = str_field(saved, "app_id");
        if id.is_empty() {
            return Err(CarrierError::Config {
                carrier: CARRIER,
                message: "the number has no application, and Plivo cannot return a number to \
                          that state; attach an application to it in the console, then wire"
                    .into(),
            });
        }
        if !path_safe(&id) {
            return Err(bad_record(CARRIER));
        }
        Ok(id)
    }
}

impl NumberAdmin for PlivoNumbers {
    fn check_credentials(&self) -> BoxFuture<Result<String, CarrierError>> {
        let this = PlivoNumbers(self.0.clone());
        Box::pin(async move {
            let v = this.get(this.account_url()).await?;
            Ok(format!(
                "account {} ({})",
                this.0.auth_id,
                str_field(&v, "account_type")
            ))
        })
    }

    fn inbound_url(&self, public_url: &str) -> String {
        public_request_url(public_url, "/plivo/answer", None)
    }

    fn read_wiring(&self, number: &str) -> BoxFuture<Result<Wiring, CarrierError>> {
        let this = PlivoNumbers(self.0.clone());
        let number = number.to_string();
        Box::pin(async move { this.read(number).await })
    }

    fn wire_plan(
        &self,
        current: &Wiring,
        public_url: &str,
    ) -> Result<Vec<AdminRequest>, CarrierError> {
        let app_id = Self::app_id(&current.saved)?;
        Ok(vec![AdminRequest::json(
            AdminMethod::Post,
            self.app_url(&app_id),
            &json!({
                "answer_url": self.inbound_url(public_url),
                "answer_method": "POST",
                "hangup_url": public_request_url(public_url, "/plivo/hangup", None),
                "hangup_method": "POST",
            }),
        )])
    }

    fn restore_plan(&self, previous: &Wiring) -> Result<Vec<AdminRequest>, CarrierError> {
        // Wiring changed the application only: the number itself has nothing to restore,
        // unless the record is from before applications were kept apart.
        match previous.app {
            Some(_) => Ok(Vec::new()),
            None => self.app_restore(&previous.saved),
        }
    }

    fn app_numbers(&self, app: &SharedApp) -> BoxFuture<Result<Vec<String>, CarrierError>> {
        let this = PlivoNumbers(self.0.clone());
        let id = app.id.clone();
        Box::pin(async move { this.numbers_on(&id).await })
    }

    fn restore_app_plan(&self, app: &SharedApp) -> Result<Vec<AdminRequest>, CarrierError> {
        self.app_restore(&app.saved)
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

/// The number administration of a `kind = "plivo"` account.
pub fn admin(cfg: &super::Config) -> Result<Box<dyn NumberAdmin>, CarrierError> {
    Ok(Box::new(PlivoNumbers(PlivoRest::from_config(cfg)?)))
}
