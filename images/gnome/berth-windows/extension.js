// berth: the main windows of the applications OSWorld's tasks use open maximised, as its Ubuntu
// VM shows them (each was left maximised there, and the apps remember). Dialogs, other programs'
// windows and a window the user resizes afterwards keep their own size.
/* exported init */
const { GLib, Meta } = imports.gi;

// WM_CLASS class or instance names, lower-cased; a name matches when it starts with one.
const MAXIMISED = [
    'google-chrome', 'chromium', 'libreoffice', 'soffice', 'gimp', 'vlc', 'thunderbird', 'mail',
    'code', 'evince', 'org.gnome.evince', 'totem', 'org.gnome.totem',
];

function wanted(win) {
    if (win.get_window_type() !== Meta.WindowType.NORMAL || win.get_transient_for() !== null)
        return false;
    const names = [win.get_wm_class(), win.get_wm_class_instance()]
        .filter(n => n)
        .map(n => n.toLowerCase());
    return names.some(n => MAXIMISED.some(m => n.startsWith(m)));
}

// How long after its first frame a window that unmaximises itself is maximised again: programs
// that restore a saved geometry (LibreOffice) do it just after mapping, not a user.
const SETTLE_MS = 3000;

function maximise(win) {
    if (win.can_maximize() && win.get_maximized() !== Meta.MaximizeFlags.BOTH)
        win.maximize(Meta.MaximizeFlags.BOTH);
}

function maximiseAndHold(win) {
    maximise(win);
    const until = GLib.get_monotonic_time() + SETTLE_MS * 1000;
    const id = win.connect('size-changed', () => {
        if (GLib.get_monotonic_time() > until) {
            win.disconnect(id);
            return;
        }
        maximise(win);
    });
    win.connect('unmanaged', () => {
        if (GLib.get_monotonic_time() <= until)
            win.disconnect(id);
    });
}

class Extension {
    enable() {
        this._created = global.display.connect('window-created', (display, win) => {
            if (!wanted(win))
                return;
            // Once the window has drawn its first frame it has the size the program asked for;
            // maximised before that, a program's own geometry request can undo it.
            const actor = win.get_compositor_private();
            if (actor) {
                const id = actor.connect('first-frame', () => {
                    actor.disconnect(id);
                    maximiseAndHold(win);
                });
            } else {
                Meta.later_add(Meta.LaterType.BEFORE_REDRAW, () => {
                    maximiseAndHold(win);
                    return false;
                });
            }
        });
    }

    disable() {
        if (this._created)
            global.display.disconnect(this._created);
        this._created = 0;
    }
}

function init() {
    return new Extension();
}
