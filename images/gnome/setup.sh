#!/bin/sh
# berth: the osworld image's GNOME session and the first-run state of OSWorld's Ubuntu VM, run by
# the image builder in the image's root (as root) after the packages and the files beside this
# script are in place. Idempotent.
set -eu
H=/home/user

# English (US) as the VM's locale, and a time zone that is not UTC (OSWorld's "set my time zone
# to UTC+0" must not hold before an agent acts).
sed -i 's/^# *\(en_US.UTF-8 UTF-8\)/\1/' /etc/locale.gen
locale-gen >/dev/null
echo 'LANG=en_US.UTF-8' > /etc/default/locale
ln -sf /usr/share/zoneinfo/America/Los_Angeles /etc/localtime
echo America/Los_Angeles > /etc/timezone

glib-compile-schemas /usr/share/glib-2.0/schemas
dconf update

# The system bus starts systemd's date, host-name and locale daemons itself (there is no
# systemd to ask): GNOME Settings' Date & Time and `timedatectl` reach timedated that way.
for s in timedate1:timedated hostname1:hostnamed locale1:localed; do
    printf '[D-BUS Service]\nName=org.freedesktop.%s\nExec=/lib/systemd/systemd-%s\nUser=root\n' \
        "${s%%:*}" "${s##*:}" > "/usr/share/dbus-1/system-services/org.freedesktop.${s%%:*}.service"
done
# systemd's packaging leaves /run/systemd/seats behind, which tells GNOME Shell a logind runs.
rm -rf /run/systemd

# Google Chrome's commands, where its .desktop file and OSWorld's tasks name them: the desktop's
# browser on its profile (the agent writes the command into its state dir).
for c in google-chrome google-chrome-stable; do
    ln -sf /var/lib/berth-agent/desktop-bin/google-chrome "/usr/bin/$c"
done
# The image's other session's programs (XFCE's terminal and file manager), Chromium under its
# own name and JupyterLab stay out of GNOME's app grid, as on Ubuntu; they still open files.
mkdir -p /usr/local/share/applications
for f in thunar thunar-bulk-rename thunar-settings xfce4-terminal chromium jupyterlab; do
    for dir in /usr/local/share/applications /usr/share/applications; do
        if [ -f "$dir/$f.desktop" ]; then
            sed '/^\[Desktop Entry\]/a NoDisplay=true' "$dir/$f.desktop" > "/tmp/$f.desktop"
            mv "/tmp/$f.desktop" "/usr/local/share/applications/$f.desktop"
            break
        fi
    done
done
update-desktop-database -q /usr/share/applications || true
update-desktop-database -q /usr/local/share/applications || true

# Thunderbird's windows carry the WM_CLASS of OSWorld's Ubuntu build, "Mail.thunderbird" (Debian's
# build says "thunderbird-default", its compiled-in remoting name), so the Thunderbird tasks'
# close_window('Mail.thunderbird', strict, by_class) quits it as on the VM: Gecko takes the name
# from MOZ_APP_REMOTINGNAME, which Debian's launcher script now sets however it is started; the
# .desktop file names the same class, so the dock knows the window as its launcher's.
if [ -x /usr/bin/thunderbird ]; then
    sed -i '/^export MOZ_APP_LAUNCHER$/a export MOZ_APP_REMOTINGNAME=thunderbird' /usr/bin/thunderbird
    grep -qx 'export MOZ_APP_REMOTINGNAME=thunderbird' /usr/bin/thunderbird
    sed -i 's/^StartupWMClass=.*/StartupWMClass=thunderbird/' /usr/share/applications/thunderbird.desktop
fi

# OSWorld's tasks `pip install` into the system Python.
printf '[global]\nbreak-system-packages = true\n' > /etc/pip.conf

# A wallpaper in Ubuntu's colours, as a real PNG (a task reads the wallpaper's pixels).
mkdir -p /usr/share/backgrounds/berth
python3 - <<'PY'
from PIL import Image
w, h = 1920, 1080
a, b = (44, 0, 30), (233, 84, 32)
img = Image.new("RGB", (w, h))
px = img.load()
for y in range(h):
    for x in range(w):
        t = min(1.0, max(0.0, (x / w) * 0.75 + (y / h) * 0.25) ** 1.6)
        px[x, y] = tuple(int(a[i] + (b[i] - a[i]) * t) for i in range(3))
img.save("/usr/share/backgrounds/berth/ubuntu-like.png")
PY

as_user() { su user -s /bin/sh -c "cd $H && HOME=$H $1"; }

# The user's folders (Desktop, Documents, …) and GNOME's first-run markers: no lock-screen warning.
as_user 'xdg-user-dirs-update'
as_user 'mkdir -p .local/share/gnome-shell .config/Code/User && touch .local/share/gnome-shell/lock-warning-shown'

# VLC: its full stock configuration (the getters read default lines too), with the privacy
# question answered and the HTTP interface OSWorld's getters call on :8080 (password
# `password`).
as_user 'rm -rf .config/vlc && timeout 60 vlc -I dummy --reset-config vlc://quit >/dev/null 2>&1'
sed -i -e 's/^#qt-privacy-ask=.*/qt-privacy-ask=0/' \
       -e 's/^#metadata-network-access=.*/metadata-network-access=0/' \
       -e 's/^#extraintf=.*/extraintf=http/' \
       -e 's/^#http-password=.*/http-password=password/' "$H/.config/vlc/vlcrc"
grep -q '^qt-privacy-ask=0' "$H/.config/vlc/vlcrc"

# LibreOffice: after its first run (no tips, no first-run bars, Office formats kept on save).
lo=$(dpkg-query -W -f '${Version}' libreoffice-core | sed 's/^[0-9]*://; s/^\([0-9]*\.[0-9]*\).*/\1/')
as_user 'mkdir -p .config/libreoffice/4/user'
sed "s/@LO_VERSION@/$lo/" /tmp/berth-gnome/registrymodifications.xcu > "$H/.config/libreoffice/4/user/registrymodifications.xcu"

# Chrome: a used profile (Local State, Default/Preferences, first run done) with an empty
# bookmark bar, as the browser leaves it (its flags as the desktop runs it).
as_user 'rm -rf .config/google-chrome && timeout 60 /usr/lib/chromium/chromium --headless=new --no-sandbox --disable-dev-shm-usage --user-data-dir=.config/google-chrome --no-first-run --disable-gpu --disable-features=LocalNetworkAccessChecks --password-store=basic --dump-dom about:blank >/dev/null 2>&1'
test -s "$H/.config/google-chrome/Default/Preferences"
touch "$H/.config/google-chrome/First Run"
cp /tmp/berth-gnome/Bookmarks "$H/.config/google-chrome/Default/Bookmarks"
rm -f "$H/.config/google-chrome/SingletonLock" "$H/.config/google-chrome/SingletonSocket" "$H/.config/google-chrome/SingletonCookie"

chown -R user:user "$H"
