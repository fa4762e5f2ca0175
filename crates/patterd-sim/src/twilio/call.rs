//! Twilio's media stream in the simulator: the carrier-neutral stream driver of
//! [`crate::stream`] speaking the Twilio dialect (the default of [`SimCallConfig::new`]).
//! Kept as a module so Twilio tests keep their paths.

pub use crate::stream::*;
