package resolver

import (
	"context"
	"time"
)

// SetSleep replaces the client's backoff sleep (tests record durations
// instead of waiting).
func SetSleep(c *Config, f func(context.Context, time.Duration) error) { c.sleep = f }
