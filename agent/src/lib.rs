//! plexd, the plexsphere node agent: enrols a Linux host and keeps it in the WireGuard mesh.
//!
//! The binary (`main.rs`) only parses the command line and calls [`app::main`]. Each subsystem
//! owns a module: [`config`] (config.yaml), [`tls`] (trust), [`api_client`] (HTTP),
//! [`identity`] (key and state files), [`join`] (enrolment), [`install`], [`daemon`] (`run`),
//! [`mesh`] (WireGuard backends and the peer reconcile), [`reach`] (direct paths through NATs,
//! relays otherwise: a sans-IO engine and the runtime that drives it), [`diag`] (`plexd ping`,
//! `netcheck`, `bugreport`), [`logging`], and [`exit`] (the exit codes and the one place errors
//! map to them). docs/architecture.md names the words every sans-IO machine here uses.

pub mod api_client;
pub mod app;
pub mod backoff;
pub mod check_config;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod diag;
pub mod dns;
pub mod echo;
pub mod exit;
pub mod fdlimit;
pub mod fsutil;
pub mod identity;
pub mod install;
pub mod jitter;
pub mod join;
pub mod logging;
pub mod mesh;
pub mod node_api;
pub mod path_report;
pub mod paths;
pub mod reach;
pub mod routes;
pub mod tls;
