//! The loop's relays: the TCP links with TLS the node asks for (the relay set, a sans-IO
//! machine in `reach::node::relays`, decides the connections, the home relay, the move to TCP
//! and idle closes), and what each link reads or its end, handed to the node.

use std::net::SocketAddr;

use super::event_loop::Loop;
use super::shared::tcp_sink;
use crate::reach::io::Now;
use crate::reach::relay_client::tcp::{TcpEvent, TcpLink};

impl Loop {
    /// Opens the TCP link with TLS the relay set asked for; one that cannot start is reported
    /// back as ended.
    pub(super) fn open_link(
        &mut self,
        relay: String,
        addr: SocketAddr,
        server_name: String,
        now: Now,
    ) {
        if self.links.contains_key(&relay) {
            return;
        }
        let Some(tls) = self.setup.tls.clone() else {
            self.node
                .handle_tcp_closed(&relay, "this node has no TLS trust for relays", now);
            return;
        };
        let sink = tcp_sink(self.shared.clone(), relay.clone());
        let door = self.setup.control.link_door();
        match TcpLink::open(addr, server_name, tls, door, sink) {
            Ok(link) => {
                self.links.insert(relay, link);
            }
            Err(e) => {
                tracing::warn!(relay, "cannot start a TCP connection to relay {relay}: {e}");
                self.node
                    .handle_tcp_closed(&relay, &format!("it could not start: {e}"), now);
            }
        }
    }

    pub(super) fn tcp(&mut self, relay: String, event: TcpEvent, now: Now) {
        match event {
            TcpEvent::Frame(frame) => self.node.handle_tcp_frame(&relay, frame, now),
            TcpEvent::Closed(why) => {
                self.links.remove(&relay);
                self.node.handle_tcp_closed(&relay, &why, now);
            }
        }
        self.drain(now);
    }
}
