//! `?region=x,y,w,h` of `GET /v1/screenshot`: `api::display::parse_region`.
#![no_main]

use axum::http::StatusCode;
use berth_agent::api::display::parse_region;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let s = String::from_utf8_lossy(data);
    match parse_region(&s) {
        Ok((x, y, w, h)) => {
            // Four comma-separated numbers, each as Rust prints it when written back.
            let parts: Vec<&str> = s.split(',').map(str::trim).collect();
            assert_eq!(parts.len(), 4, "{s:?}");
            assert_eq!(parts[0].parse::<i32>(), Ok(x));
            assert_eq!(parts[1].parse::<i32>(), Ok(y));
            assert_eq!(parts[2].parse::<u32>(), Ok(w));
            assert_eq!(parts[3].parse::<u32>(), Ok(h));
            assert_eq!(
                parse_region(&format!("{x},{y},{w},{h}")).unwrap(),
                (x, y, w, h)
            );
        }
        Err(e) => {
            // Bad input is the client's: a 400 naming the region as given.
            assert_eq!(e.status, StatusCode::BAD_REQUEST);
            assert_eq!(e.code, "invalid_request");
            assert!(e.message.contains(&format!("{s:?}")), "{}", e.message);
        }
    }
});
