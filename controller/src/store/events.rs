//! The `events` table: each sandbox's timeline, numbered per sandbox.

use rusqlite::params;
use serde_json::{Map, Value};

use super::{Result, Store};
use crate::util::rfc3339;

impl Store {
    /// Appends to a sandbox's timeline; answers the event's sequence number.
    pub fn append_event(&self, sandbox_id: &str, at: i64, kind: &str, data: &Value) -> Result<u64> {
        let data = serde_json::to_string(data)?;
        self.with(|c| {
            let tx = c.unchecked_transaction()?;
            let seq = insert_event(&tx, sandbox_id, at, kind, &data)?;
            tx.commit()?;
            Ok(seq)
        })
    }

    /// A batch of imported agent events and the agent sequence number reached, atomically, so
    /// a crash never imports one twice.
    pub fn import_events(
        &self,
        sandbox_id: &str,
        events: &[(i64, String, Value)],
        agent_seq: u64,
    ) -> Result<()> {
        let encoded: Vec<(i64, &String, String)> = events
            .iter()
            .map(|(at, kind, data)| Ok((*at, kind, serde_json::to_string(data)?)))
            .collect::<Result<_>>()?;
        self.with(|c| {
            let tx = c.unchecked_transaction()?;
            let first: i64 = tx.query_row(
                "SELECT COALESCE(MAX(seq) + 1, 0) FROM events WHERE sandbox_id = ?1",
                [sandbox_id],
                |r| r.get(0),
            )?;
            for (seq, (at, kind, data)) in (first..).zip(&encoded) {
                tx.execute(
                    "INSERT INTO events (sandbox_id, seq, at, kind, data)
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                    params![sandbox_id, seq, at, kind, data],
                )?;
            }
            tx.execute(
                "UPDATE sandboxes SET agent_event_seq = ?2 WHERE id = ?1",
                params![sandbox_id, agent_seq as i64],
            )?;
            tx.commit()
        })
    }

    /// Timeline records from `from_seq`, at most `limit`, as wire objects.
    pub fn events(&self, sandbox_id: &str, from_seq: u64, limit: usize) -> Result<Vec<Value>> {
        self.with(|c| {
            let mut st = c.prepare(
                "SELECT seq, at, kind, data FROM events WHERE sandbox_id = ?1 AND seq >= ?2
                 ORDER BY seq LIMIT ?3",
            )?;
            let rows = st.query_map(params![sandbox_id, from_seq as i64, limit as i64], |r| {
                let seq: i64 = r.get(0)?;
                let at: i64 = r.get(1)?;
                let kind: String = r.get(2)?;
                let data: String = r.get(3)?;
                let mut obj: Map<String, Value> = serde_json::from_str(&data).unwrap_or_default();
                obj.insert("seq".into(), seq.into());
                obj.insert("at".into(), rfc3339(at).into());
                obj.insert("kind".into(), kind.into());
                Ok(Value::Object(obj))
            })?;
            rows.collect()
        })
    }
}

/// Appends one event inside the caller's transaction; answers its sequence number.
pub(super) fn insert_event(
    tx: &rusqlite::Transaction<'_>,
    sandbox_id: &str,
    at: i64,
    kind: &str,
    data: &str,
) -> rusqlite::Result<u64> {
    let seq: i64 = tx.query_row(
        "SELECT COALESCE(MAX(seq) + 1, 0) FROM events WHERE sandbox_id = ?1",
        [sandbox_id],
        |r| r.get(0),
    )?;
    tx.execute(
        "INSERT INTO events (sandbox_id, seq, at, kind, data) VALUES (?1, ?2, ?3, ?4, ?5)",
        params![sandbox_id, seq, at, kind, data],
    )?;
    Ok(seq as u64)
}
