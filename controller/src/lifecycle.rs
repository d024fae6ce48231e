//! The lifecycles, as the wire has them (`berth_protocol::lifecycle`), and how the store
//! names a set of statuses in SQL.

pub use berth_protocol::lifecycle::*;

/// `(a, b, …)` of the statuses' strings for an SQL `IN`: only this module's own constant
/// strings, never caller input.
pub(crate) fn sql_list<T: Copy>(statuses: &[T], as_str: impl Fn(T) -> &'static str) -> String {
    let quoted: Vec<String> = statuses
        .iter()
        .map(|&s| format!("'{}'", as_str(s)))
        .collect();
    format!("({})", quoted.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_sql_list_quotes_each_status() {
        assert_eq!(
            sql_list(&[RunStatus::Pending, RunStatus::Running], RunStatus::as_str),
            "('pending', 'running')"
        );
    }
}
