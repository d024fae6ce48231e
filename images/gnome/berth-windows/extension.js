// berth: the main windows of the applications OSWorld's tasks use open maximised, as its Ubuntu
// VM shows them (each was left maximised there, and the apps remember). Dialogs, other programs'
// windows and a window the user resizes afterwards keep their own size.
/* exported init */
const { Meta } = imports.gi;

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

function maximise(win) {
    if (win.can_maximize() && !win.get_maximized())
        win.maximize(Meta.MaximizeFlags.BOTH);
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
                    maximise(win);
                });
            } else {
                Meta.later_add(Meta.LaterType.BEFORE_REDRAW, () => {
                    maximise(win);
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
