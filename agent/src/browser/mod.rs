//! The desktop's Chromium: a DevTools client on loopback ([`cdp`]), the relays that show it
//! to clients outside ([`relay`]), and the browser toolset's long-lived connection ([`client`])
//! and tools ([`toolset`]).

pub mod cdp;
pub mod client;
pub mod login;
pub mod relay;
pub mod toolset;
