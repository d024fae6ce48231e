//! The page's input ops: pointer, keys, form fields and file inputs, sent as CDP input
//! events and DOM calls to one page's session.

use std::time::Duration;

use serde_json::json;

use super::keys::{self, Chord};
use super::plan::{Op, Target};
use super::{PageCtl, SET_VALUE, failed, stale};

impl PageCtl<'_> {
    /// Performs an input op; `run` answers every other op itself.
    pub(super) async fn act(&self, op: Op) -> Result<(), String> {
        match op {
            Op::Click {
                target,
                button,
                count,
                modifiers,
            } => self.click(&target, button, count, modifiers).await,
            Op::Hover(target) => {
                let at = self.resolve(&target).await?;
                self.mouse("mouseMoved", at, "none", 0, 0, 0).await
            }
            Op::Drag(from, to) => self.drag(from, to).await,
            Op::Down(at) => {
                self.mouse("mouseMoved", at, "none", 0, 0, 0).await?;
                self.mouse("mousePressed", at, "left", 1, 1, 0).await
            }
            Op::Up(at) => {
                self.mouse("mouseMoved", at, "left", 1, 0, 0).await?;
                self.mouse("mouseReleased", at, "left", 0, 1, 0).await
            }
            Op::Scroll { at, dx, dy } => self.scroll(at, dx, dy).await,
            Op::ScrollTo(id) => self.scroll_to(id).await,
            Op::Type(text) => self.type_text(&text).await,
            Op::Key(chords, repeat) => self.press_keys(&chords, repeat).await,
            Op::HoldKey(ch, secs) => {
                self.chord_down(&ch).await?;
                tokio::time::sleep(Duration::from_secs_f64(secs)).await;
                self.chord_up(&ch).await
            }
            Op::FormInput(id, value) => self.form_input(id, value).await,
            Op::FileUpload(id, paths) => self.upload(id, paths).await,
            // Not an input op: `run` never sends one here.
            _ => Err(failed(self.name)),
        }
    }

    /// Moves to the target, then presses and releases `button` `count` times.
    async fn click(
        &self,
        target: &Target,
        button: &str,
        count: u32,
        modifiers: u32,
    ) -> Result<(), String> {
        let at = self.resolve(target).await?;
        self.mouse("mouseMoved", at, "none", 0, 0, modifiers)
            .await?;
        let bit = match button {
            "left" => 1,
            "right" => 2,
            _ => 4,
        };
        for n in 1..=count {
            self.mouse("mousePressed", at, button, bit, n, modifiers)
                .await?;
            self.mouse("mouseReleased", at, button, 0, n, modifiers)
                .await?;
        }
        Ok(())
    }

    /// Presses the left button at `from`, moves to `to` in eight steps and releases it there.
    async fn drag(&self, from: (f64, f64), to: (f64, f64)) -> Result<(), String> {
        self.mouse("mouseMoved", from, "none", 0, 0, 0).await?;
        self.mouse("mousePressed", from, "left", 1, 1, 0).await?;
        for i in 1..=8 {
            let t = i as f64 / 8.0;
            let at = (from.0 + (to.0 - from.0) * t, from.1 + (to.1 - from.1) * t);
            self.mouse("mouseMoved", at, "left", 1, 0, 0).await?;
        }
        self.mouse("mouseReleased", to, "left", 0, 1, 0).await
    }

    /// Moves to `at` and turns the wheel by (`dx`, `dy`).
    async fn scroll(&self, at: (f64, f64), dx: f64, dy: f64) -> Result<(), String> {
        self.mouse("mouseMoved", at, "none", 0, 0, 0).await?;
        self.cdp(
            "Input.dispatchMouseEvent",
            json!({"type": "mouseWheel", "x": at.0, "y": at.1, "deltaX": dx, "deltaY": dy}),
        )
        .await?;
        Ok(())
    }

    /// Scrolls the element `ref_<id>` into view.
    async fn scroll_to(&self, id: i64) -> Result<(), String> {
        self.c
            .call(
                "DOM.scrollIntoViewIfNeeded",
                json!({"backendNodeId": id}),
                Some(self.s),
            )
            .await
            .map_err(|_| stale(id))?;
        Ok(())
    }

    /// Inserts the text line by line, a line break typed as the Return key.
    async fn type_text(&self, text: &str) -> Result<(), String> {
        let enter = keys::chord("Return").map_err(|_| failed(self.name))?;
        for (i, line) in text.split('\n').enumerate() {
            if i > 0 {
                self.chord_down(&enter).await?;
                self.chord_up(&enter).await?;
            }
            if !line.is_empty() {
                self.cdp("Input.insertText", json!({"text": line})).await?;
            }
        }
        Ok(())
    }

    /// Presses and releases each chord in order, the whole sequence `repeat` times.
    async fn press_keys(&self, chords: &[Chord], repeat: u32) -> Result<(), String> {
        for _ in 0..repeat {
            for ch in chords {
                self.chord_down(ch).await?;
                self.chord_up(ch).await?;
            }
        }
        Ok(())
    }

    /// Sets the form element `ref_<id>` to `value`; the page's own objection is the error.
    async fn form_input(&self, id: i64, value: serde_json::Value) -> Result<(), String> {
        let obj = self.object(id).await?;
        let v = self
            .cdp(
                "Runtime.callFunctionOn",
                json!({"objectId": obj, "functionDeclaration": SET_VALUE,
                       "arguments": [{"value": value}], "returnByValue": true}),
            )
            .await?;
        match v["result"]["value"].as_str() {
            Some("") => {}
            Some(problem) => return Err(format!("ref_{id}: {problem}.")),
            None => return Err(failed(self.name)),
        }
        Ok(())
    }

    /// Gives the file input `ref_<id>` the files at `paths`, each of which must exist.
    async fn upload(&self, id: i64, paths: Vec<String>) -> Result<(), String> {
        if paths.iter().any(|p| !std::path::Path::new(p).is_file()) {
            return Err("paths: a file to upload does not exist.".into());
        }
        self.c
            .call(
                "DOM.setFileInputFiles",
                json!({"files": paths, "backendNodeId": id}),
                Some(self.s),
            )
            .await
            .map_err(|_| format!("ref_{id} is not a file input."))?;
        Ok(())
    }
}
