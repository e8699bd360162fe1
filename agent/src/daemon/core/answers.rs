//! What the core makes of answers: the node API calls', the mesh's, the socket's requests, and
//! the leave from its call to the exit.

use std::path::PathBuf;
use std::sync::Arc;

use super::leave;
use super::protocol::{Answer, Request};
use super::schedule::Task;
use super::wanted::{self, ChangeLine};
use super::{
    Call, CallResult, ControlId, Core, DELETED, Effect, LEAVING_RETRY, Leaving, LiveFor,
    MeshAnswer, MeshJobId, MeshOp, Now, Outcome, Pending,
};
use crate::backoff;
use crate::exit::ExitCode;
use crate::node_api::{CallError, StateAnswer};

impl Core {
    /// The common part of every call's answer. `false` when it ended the daemon (revoked or
    /// deleted).
    fn settle<T>(&mut self, task: Task, res: &Result<T, CallError>, now: Now) -> bool {
        match res {
            Ok(_) => {
                self.api.call_ok(now.at);
                let unit = self.jitter.unit();
                self.schedule.done(task, now.at, unit);
            }
            Err(CallError::Unauthorized | CallError::Revoked) if self.is_leaving() => {
                // The server forgot this node because it is leaving: the leave's own answer
                // ends the daemon (and answers `plexd leave`), not this call.
                tracing::debug!(
                    task = task.name(),
                    "the control plane no longer knows this node; waiting for the leave to finish"
                );
                let unit = self.jitter.unit();
                self.schedule.failed(task, now.at, LEAVING_RETRY, unit);
            }
            Err(CallError::Unauthorized) => {
                self.exit(Outcome::Gone(DELETED.to_owned()));
                return false;
            }
            Err(CallError::Revoked) => {
                self.revoked(now);
                return false;
            }
            Err(CallError::CloneRefused) => {
                self.cloned();
                return false;
            }
            Err(e) => {
                let unreachable = matches!(e, CallError::Unreachable(_));
                let unit = self.jitter.unit();
                let delay = self.api.call_failed(unreachable, unit, e.retry_after());
                tracing::warn!(
                    task = task.name(),
                    "{} failed: {e}; retrying in {} s",
                    task.name(),
                    backoff::secs_text(delay)
                );
                self.api.error(now.at, format!("{}: {e}", task.name()));
                let unit = self.jitter.unit();
                self.schedule.failed(task, now.at, delay, unit);
            }
        }
        true
    }

    pub(super) fn on_call(&mut self, r: CallResult, now: Now) {
        match r {
            CallResult::Heartbeat(res) => {
                if !self.settle(Task::Heartbeat, &res, now) {
                    return;
                }
                if let Ok(ack) = res {
                    if let Some(token) = &ack.relay_token {
                        self.feed_relay_token(token);
                    }
                    self.rotation_requested(&ack, now);
                    self.last_heartbeat = Some(now.at);
                    self.server_intervals = ack.intervals;
                    let merged = self.config.daemon.intervals.apply(ack.intervals);
                    let unit = self.jitter.unit();
                    self.schedule.set_intervals(merged, now.at, unit);
                    let known = self.state_version.unwrap_or(0).max(self.last_seq);
                    if ack.state_version > known || self.state_version.is_none() || self.full_pull {
                        self.schedule.run_soon(Task::StatePoll, now.at);
                    }
                }
            }
            CallResult::Endpoints(res) => {
                if !self.settle(Task::EndpointReport, &res, now) {
                    return;
                }
                if let Ok(ack) = res {
                    tracing::debug!(observed = %ack.observed, endpoints = ?ack.endpoints, "endpoints reported");
                }
            }
            CallResult::State(res) => {
                if !self.settle(Task::StatePoll, &res, now) {
                    return;
                }
                match res {
                    Ok(StateAnswer::Body(body)) => {
                        let floor = Some(self.state_accept_floor());
                        let checked =
                            self.acceptor
                                .state_json(&body, floor)
                                .and_then(|(s, e, by)| {
                                    self.acceptor.fresh(&s, now.wall, super::MAX_STATE_AGE)?;
                                    Ok((s, e, by))
                                });
                        match checked {
                            Ok((state, env, by)) => {
                                self.full_pull = false;
                                self.last_api_state = Some(now.at);
                                self.signed_by(by, state.next_signing_key.as_ref(), false, now);
                                self.install_state(state, env, true, now);
                            }
                            Err(refusal) => {
                                if super::accept::is_unknown_signer(&refusal) {
                                    self.unknown_signer(now);
                                }
                                tracing::warn!(applied_version = ?self.state_version, "refused a state document from the control plane: {refusal}; keeping the last good state");
                                self.error_observation(
                                    format!("state document refused: {refusal}"),
                                    now,
                                );
                            }
                        }
                    }
                    Ok(StateAnswer::NotModified) => tracing::debug!("state unchanged (304)"),
                    Err(_) => {}
                }
            }
            CallResult::Ingest(res) => {
                match &res {
                    Ok(()) => self.ingest.acknowledge(),
                    Err(e) if e.is_final() => {
                        let n = self.ingest.discard();
                        tracing::warn!(
                            "the control plane refused an ingest batch of {n} observations: {e}; they are counted as dropped"
                        );
                    }
                    Err(_) => self.ingest.retry_later(),
                }
                if !self.settle(Task::IngestFlush, &res, now) {
                    return;
                }
            }
            CallResult::Leave(res) => {
                let Some(waiter) = self.leaving.as_ref().map(|l| l.waiter) else {
                    return;
                };
                match leave::note(&self.id, res) {
                    Ok(note) => {
                        if let Some(l) = &mut self.leaving {
                            l.note = Some(note);
                        }
                        self.ask_mesh(MeshOp::Teardown, Pending::Teardown, now);
                    }
                    Err(f) => {
                        tracing::warn!("{}", f.message);
                        self.leaving = None;
                        self.emit(Effect::Answer {
                            id: waiter,
                            answer: Answer::error(f.message, f.code),
                        });
                    }
                }
                return;
            }
            CallResult::RotateKey(res) => self.on_key_rotated(res, now),
            CallResult::RotateCredential(res) => self.on_credential_rotated(res, now),
            CallResult::SigningKeys(res) => self.on_key_chain(res, now),
        }
        self.update_status();
    }

    /// The leave's last step: the files are gone, answer `plexd leave` and end.
    pub(super) fn on_files_removed(&mut self, files: &[PathBuf]) {
        let Some(Leaving {
            waiter,
            note: Some(note),
        }) = self.leaving.take()
        else {
            return;
        };
        let message = leave::left_message(self.id.node_id, &note, files);
        tracing::info!("{message}");
        self.emit(Effect::Answer {
            id: waiter,
            answer: Answer::Left { message },
        });
        self.exit(Outcome::Left);
    }

    pub(super) fn on_control(&mut self, id: ControlId, request: Request, now: Now) {
        match request {
            Request::Status => self.read_live(LiveFor::Status(id), now),
            // The executor runs the probe and asks for the status after it; one that reaches
            // the core has no probe to run (the kernel or none backend).
            Request::ProbeGso => self.emit(Effect::Answer {
                id,
                answer: Answer::error(
                    "this backend does not run the GSO path probe (only the embedded userspace data plane does)",
                    ExitCode::Io,
                ),
            }),
            Request::Leave if self.is_leaving() => self.emit(Effect::Answer {
                id,
                answer: Answer::error("a leave is already in progress", ExitCode::Io),
            }),
            Request::Leave => {
                tracing::info!("leaving the mesh: deregistering from the control plane");
                self.leaving = Some(Leaving {
                    waiter: id,
                    note: None,
                });
                self.emit(Effect::Call(Call::Leave));
            }
            Request::Policy => {
                let answer = Answer::Policy(Box::new(self.policy_report()));
                self.emit(Effect::Answer { id, answer });
            }
            Request::RotateKey => self.rotate_now(id, super::rotation_state::Kind::Key, now),
            Request::RotateCredential => {
                self.rotate_now(id, super::rotation_state::Kind::Credential, now)
            }
        }
    }

    pub(super) fn on_mesh(&mut self, id: MeshJobId, answer: MeshAnswer, now: Now) {
        self.watchdog.answered(id);
        let Some(pending) = self.mesh_jobs.answered(id) else {
            return;
        };
        match (pending, answer) {
            (Pending::Apply(sent, version), MeshAnswer::Applied(res, policy)) => {
                if let Some(r) = policy {
                    self.policy_installed(version, r.map_err(|e| *e), now);
                }
                self.applied(sent, res.map_err(|e| e.to_string()), now)
            }
            (Pending::Apply(sent, _), _) => {
                self.applied(sent, Err("the mesh thread is busy".to_owned()), now)
            }
            (Pending::Live(why), MeshAnswer::Live(res)) => {
                let live = res.unwrap_or_default();
                self.on_live(why, &live, now);
            }
            (Pending::Live(why), _) => self.on_live(why, &[], now),
            (Pending::SetKey(done), MeshAnswer::KeySet(res)) => self.on_key_set(*done, res, now),
            (Pending::SetKey(done), _) => {
                let busy = crate::mesh::MeshError {
                    backend: self.backend,
                    interface: self.config.wireguard.interface.clone(),
                    what: "the mesh thread is busy".to_owned(),
                };
                self.on_key_set(*done, Err(busy), now)
            }
            (Pending::Teardown, answer) => {
                if let MeshAnswer::TornDown(Err(e)) = &answer {
                    tracing::warn!(error = %e, "could not tear the mesh down; remove the interface by hand");
                }
                self.emit(Effect::RemoveNodeFiles);
            }
        }
    }

    fn applied(
        &mut self,
        sent: Arc<Vec<plexsphere_wire::node::PeerSpec>>,
        res: Result<Vec<crate::mesh::diff::MeshChange>, String>,
        now: Now,
    ) {
        match res {
            Ok(changes) => log_changes(&wanted::change_lines(
                &changes,
                self.mesh_jobs.applied(),
                &sent,
            )),
            Err(e) => {
                tracing::error!("cannot apply the peers: {e}");
                self.error_observation(e, now);
            }
        }
        self.mesh_jobs.set_applied(sent);
        if self.exited {
            return;
        }
        if self.mesh_jobs.take_apply_again() {
            self.apply_mesh(now);
        } else if self.readiness.apply_answered() {
            self.become_ready_when_settled();
        }
    }
}

/// The journal's lines for what changed on the interface, each with the peer's fields.
fn log_changes(lines: &[ChangeLine]) {
    for line in lines {
        match line {
            ChangeLine::Peer { peer: p, .. } => {
                let endpoint = wanted::first_endpoint(p);
                tracing::info!(
                    peer = %p.node_id,
                    hostname = %p.hostname,
                    peer_mesh_ip = %p.mesh_ip,
                    endpoint = ?endpoint,
                    "{}",
                    line.text()
                );
            }
            ChangeLine::Stranger(key) => tracing::info!(peer_key = %key, "{}", line.text()),
            ChangeLine::Skipped { node_id, .. } => {
                tracing::warn!(peer = %node_id, "{}", line.text());
            }
        }
    }
}
