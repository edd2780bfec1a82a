package resolver

import (
	"context"
	"io"
	"log/slog"
	"time"
)

// SetSleep replaces the client's backoff sleep (tests record durations
// instead of waiting).
func SetSleep(c *Config, f func(context.Context, time.Duration) error) { c.sleep = f }

// StreamClient returns a Client for services with no goroutines and no
// server, for feeding it a stream by hand.
func StreamClient(services []string, opts ...Option) (*Client, error) {
	cache, err := NewCache(services, opts...)
	if err != nil {
		return nil, err
	}
	return &Client{
		cfg:   Config{Logger: slog.New(slog.DiscardHandler), HeartbeatTimeout: time.Hour},
		cache: cache, updated: make(chan struct{}), done: make(chan struct{}),
	}, nil
}

// Feed reads one watch stream body into c as a subscription would, and
// returns why it ended.
func Feed(c *Client, body io.Reader) error {
	dog := time.NewTimer(time.Hour)
	defer dog.Stop()
	return c.read(body, dog).err
}
