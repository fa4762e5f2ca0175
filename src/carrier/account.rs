//! What every carrier's accounts share: the neutral view of a `[carriers.NAME]` section
//! ([`AccountConfig`]: API root, missing credentials, outbound readiness), reading such a
//! section by its `kind` tag ([`deserialize_tagged`]), and the list of usable accounts a
//! carrier keeps ([`Accounts`]), built the same way for every carrier.

use std::fmt;
use std::sync::Arc;

use serde::de::value::MapDeserializer;
use serde::de::{self, IntoDeserializer, MapAccess, Visitor};

use super::{CarrierError, CarrierKind};

/// The keys of a `[carriers.NAME]` section other than `kind`, ready for the variant's own
/// (`deny_unknown_fields`) struct.
pub(crate) type Keys<E> = MapDeserializer<'static, std::vec::IntoIter<(String, KeyValue)>, E>;

/// Reads a `[carriers.NAME]` table: `kind`, then every other key as a string at its own
/// place (a wrong type is reported at that key, like in any other table), then hands the keys
/// to `variant` for the kind's struct. Carrier keys are strings.
pub(crate) fn deserialize_tagged<'de, D, T>(
    d: D,
    variant: impl FnOnce(CarrierKind, Keys<D::Error>) -> Result<T, D::Error>,
) -> Result<T, D::Error>
where
    D: de::Deserializer<'de>,
{
    struct Tagged;
    impl<'de> Visitor<'de> for Tagged {
        type Value = (Option<CarrierKind>, Vec<(String, KeyValue)>);

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a [carriers.NAME] table")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut kind = None;
            let mut keys = Vec::new();
            while let Some(key) = map.next_key::<String>()? {
                if key == "kind" {
                    kind = Some(map.next_value::<CarrierKind>()?);
                } else {
                    let value = map.next_value::<String>()?;
                    keys.push((key, KeyValue(value)));
                }
            }
            Ok((kind, keys))
        }
    }
    let (kind, keys) = d.deserialize_map(Tagged)?;
    let kind = kind.ok_or_else(|| de::Error::missing_field("kind"))?;
    variant(kind, MapDeserializer::new(keys.into_iter()))
}

/// One carrier key's (string) value, as a deserializer: a string, or `Some(string)` for an
/// optional key.
pub(crate) struct KeyValue(String);

impl<'de, E: de::Error> IntoDeserializer<'de, E> for KeyValue {
    type Deserializer = KeyValueDeserializer<E>;

    fn into_deserializer(self) -> Self::Deserializer {
        KeyValueDeserializer(self.0, std::marker::PhantomData)
    }
}

/// The deserializer of a [`KeyValue`].
pub(crate) struct KeyValueDeserializer<E>(String, std::marker::PhantomData<E>);

impl<'de, E: de::Error> de::Deserializer<'de> for KeyValueDeserializer<E> {
    type Error = E;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, E> {
        visitor.visit_string(self.0)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, E> {
        visitor.visit_some(self)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct newtype_struct seq tuple
        tuple_struct map struct enum identifier ignored_any
    }
}

/// A carrier's `[carriers.NAME]` keys, seen carrier-neutrally (validation, warnings, the 503
/// of an unconfigured carrier).
pub trait AccountConfig: Send + Sync {
    /// The carrier's public REST API root.
    fn default_api_base(&self) -> &'static str;
    /// `api_base_url` as written, if set.
    fn api_base_url(&self) -> Option<&str>;
    /// Names of the credentials still empty (none when the account is usable).
    fn missing_credentials(&self) -> Vec<&'static str>;
    /// Why the account cannot place calls, if it cannot (ends "… through [carriers.NAME], ").
    fn outbound_problem(&self) -> Option<String> {
        None
    }
    /// Why the account cannot send text messages, if it cannot (ends "… through
    /// [carriers.NAME], "). Only the carriers whose `sms.rs` implements them can.
    fn sms_problem(&self) -> Option<String> {
        Some(
            "whose kind cannot send text messages through patterd (Twilio, Telnyx and Plivo \
             accounts can)"
                .into(),
        )
    }
    /// The REST API root: `api_base_url`, or the public default.
    fn api_base(&self) -> &str {
        match self.api_base_url() {
            Some(u) => u.trim_end_matches('/'),
            None => self.default_api_base(),
        }
    }
}

/// The names of the credentials whose value is empty, from `(name, is_empty)` pairs in the
/// order they are reported (for [`AccountConfig::missing_credentials`]).
pub(crate) fn missing_credentials(credentials: &[(&'static str, bool)]) -> Vec<&'static str> {
    credentials
        .iter()
        .filter(|(_, empty)| *empty)
        .map(|(name, _)| *name)
        .collect()
}

/// The API-root methods of an [`AccountConfig`] impl whose struct has an
/// `api_base_url: Option<String>` field and whose carrier's public root is `$default`.
macro_rules! account_api_base {
    ($default:expr) => {
        fn default_api_base(&self) -> &'static str {
            $default
        }

        fn api_base_url(&self) -> Option<&str> {
            self.api_base_url.as_deref()
        }
    };
}
pub(crate) use account_api_base;

/// One usable account: its `[carriers.NAME]` name, the key that verifies its webhooks and
/// its REST client.
pub struct Account<R> {
    pub name: String,
    pub(crate) verify_key: String,
    pub rest: Arc<R>,
}

/// A carrier's usable accounts (those with every credential set and a working client).
pub struct Accounts<R> {
    pub list: Vec<Account<R>>,
    /// The credential keys an account of this carrier needs (for the 503 message).
    pub required: Vec<&'static str>,
}

impl<R> Accounts<R> {
    /// Keeps the accounts with all credentials; `make` builds the verify key and client (an
    /// account it refuses is logged and left out).
    pub fn build<C: AccountConfig + Default>(
        kind: CarrierKind,
        configs: Vec<(String, C)>,
        make: impl Fn(&C) -> Result<(String, R), CarrierError>,
    ) -> Self {
        let list = configs
            .into_iter()
            .filter(|(_, c)| c.missing_credentials().is_empty())
            .filter_map(|(name, c)| match make(&c) {
                Ok((verify_key, rest)) => Some(Account {
                    name,
                    verify_key,
                    rest: Arc::new(rest),
                }),
                Err(e) => {
                    tracing::error!(carrier = %name, kind = kind.as_str(), error = %e, "carrier account unusable");
                    None
                }
            })
            .collect();
        Self {
            list,
            required: C::default().missing_credentials(),
        }
    }

    pub fn get(&self, name: &str) -> Option<&Account<R>> {
        self.list.iter().find(|a| a.name == name)
    }

    /// The REST client of the usable account `name`.
    pub fn rest(&self, name: &str) -> Option<Arc<R>> {
        self.get(name).map(|a| a.rest.clone())
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The first account whose key verifies a webhook.
    pub(crate) fn verifying(&self, mut verify: impl FnMut(&str) -> bool) -> Option<&Account<R>> {
        self.list.iter().find(|a| verify(&a.verify_key))
    }
}
