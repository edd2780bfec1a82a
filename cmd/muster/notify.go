package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/musterhq/muster/internal/notify"
)

// notifyFlags adds --alert-targets; apply reads it (the flag wins over
// MUSTER_ALERT_TARGETS) and MUSTER_ALERT_RESEND into c, loading and
// checking the targets file, so a malformed one is refused before
// anything starts.
func notifyFlags(fs *flag.FlagSet) (apply func(c *Config) error) {
	var path string
	fs.StringVar(&path, "alert-targets", "", "file (YAML by .yaml/.yml, JSON otherwise) naming the notification targets alarms are sent to: the platform's Alertmanager or webhook and each owning team's (MUSTER_ALERT_TARGETS; docs/production.md)")
	return func(c *Config) error {
		c.AlertTargets = cmpOr(path, os.Getenv("MUSTER_ALERT_TARGETS"))
		resend := notify.DefaultResend
		if v := os.Getenv("MUSTER_ALERT_RESEND"); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d < time.Second {
				return fmt.Errorf("MUSTER_ALERT_RESEND %q: want a duration of at least 1s, e.g. 1m (under Alertmanager's resolve_timeout)", v)
			}
			resend = d
		}
		if c.AlertTargets == "" {
			return nil
		}
		t, err := notify.LoadTargets(c.AlertTargets)
		if err != nil {
			return fmt.Errorf("--alert-targets: %w", err)
		}
		c.notify = &notify.Config{Targets: t, Resend: resend}
		return nil
	}
}
