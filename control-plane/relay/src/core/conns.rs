//! TCP connections in the core: admitting a new one (bounded in total and per source address)
//! and forgetting a closed one with the registration bound to it.

use std::net::SocketAddr;
use std::time::Instant;

use tokio::sync::mpsc;

use super::{ConnId, Core, Limit, Peer, TcpConn};
use crate::prefix::conn_source;

impl Core {
    /// A new TCP connection's writer queue, or `None` at `max_tcp_connections` or when its
    /// source holds `max_tcp_per_source` already.
    pub fn handle_tcp_open(
        &mut self,
        tx: mpsc::Sender<Vec<u8>>,
        addr: SocketAddr,
        now: Instant,
    ) -> Option<ConnId> {
        let source = conn_source(addr.ip());
        if self.per_source.get(&source).copied().unwrap_or(0) >= self.limits.tcp_per_source() {
            self.counters.tcp_refused_per_source.inc();
            self.hit(Limit::TcpPerSource, now);
            return None;
        }
        if self.conns.len() >= self.limits.max_tcp_connections {
            self.hit(Limit::MaxTcp, now);
            return None;
        }
        let id = self.next_conn;
        self.next_conn += 1;
        self.conns.insert(id, TcpConn { tx, addr });
        *self.per_source.entry(source).or_insert(0) += 1;
        Some(id)
    }

    /// Forgets a closed TCP connection and the registration bound to it.
    pub fn handle_tcp_close(&mut self, id: ConnId) {
        if let Some(conn) = self.conns.remove(&id) {
            let source = conn_source(conn.addr.ip());
            if let Some(n) = self.per_source.get_mut(&source) {
                *n -= 1;
                if *n == 0 {
                    self.per_source.remove(&source);
                }
            }
        }
        if let Some(node) = self.by_peer.remove(&Peer::Tcp(id)) {
            self.forget(&node);
        }
    }
}
