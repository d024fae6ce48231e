// berth's osworld image: Thunderbird past its first run, as OSWorld's VM has it: no start page
// from the internet, no "make Thunderbird your default mail client" or rights notice, and the
// window's own title bar (not Thunderbird's drawn into its tab bar).
pref("mailnews.start_page.enabled", false);
pref("mail.shell.checkDefaultClient", false);
pref("mail.rights.version", 1);
pref("datareporting.policy.dataSubmissionPolicyBypassNotification", true);
pref("datareporting.policy.dataSubmissionEnabled", false);
pref("toolkit.telemetry.reportingpolicy.firstRun", false);
pref("mail.tabs.drawInTitlebar", false);
pref("app.update.enabled", false);
