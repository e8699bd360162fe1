//! What a deadline starts: the watchdog's turn (and its probe of the mesh), the periodic
//! tasks that are due, the event stream's next attempt or the end of a stalled one.

use super::schedule::Task;
use super::stream_state::StreamDue;
use super::{Call, Core, Effect, LiveFor, Now};

impl Core {
    pub(super) fn on_tick(&mut self, now: Now) {
        if self.watchdog.due(now.at) {
            match self.watchdog.mesh_stuck(now.at) {
                None => self.emit(Effect::Notify(vec![("WATCHDOG", "1".to_owned())])),
                Some(age) => tracing::error!(
                    "the mesh has not answered for {} s; not telling systemd the watchdog is fine, so it restarts plexd if this lasts",
                    age.as_secs()
                ),
            }
            if !self.mesh_jobs.probe_running() {
                self.read_live(LiveFor::Probe, now);
            }
        }
        for task in self.schedule.take_due(now.at) {
            self.start(task, now);
        }
        self.rotation_tick(now);
        match self.stream.due(now.at, self.stall_timeout()) {
            StreamDue::Open => self.open_stream(now),
            StreamDue::Stalled { conn } => {
                let reason = format!(
                    "no bytes for {} s, the stream stalled",
                    self.stall_timeout().as_secs()
                );
                self.emit(Effect::CloseStream { conn });
                self.stream_ended(reason, None, now);
            }
            StreamDue::Nothing => {}
        }
    }

    fn start(&mut self, task: Task, now: Now) {
        match task {
            Task::Heartbeat => self.read_live(LiveFor::Heartbeat, now),
            Task::EndpointReport => {
                // The executor fills in the runtime's candidates; these are at least as new.
                self.reach.report_started();
                let report = plexsphere_wire::node::EndpointReport {
                    listen_port: self.config.wireguard.listen_port,
                    addresses: vec![],
                    reflexive: vec![],
                    home_relay: None,
                    nat: Default::default(),
                };
                self.emit(Effect::Call(Call::Endpoints(report)));
            }
            Task::StatePoll => {
                // Unconditional after a resync and when the last signed state is old: a `304`
                // is unsigned, so it is trusted only for STATE_REFRESH.
                let stale = self
                    .last_api_state
                    .is_none_or(|t| now.at.saturating_duration_since(t) >= super::STATE_REFRESH);
                let applied = if self.full_pull || stale {
                    None
                } else {
                    self.state_version
                };
                self.emit(Effect::Call(Call::State { applied }));
            }
            Task::IngestFlush => self.read_live(LiveFor::Observe, now),
        }
    }
}
