package main

import (
	"testing"
	"time"

	"github.com/musterhq/muster/policy"
)

func TestParseLimit(t *testing.T) {
	got, err := parseLimit("MUSTER_OVERRIDE_LIMIT", "5/10m")
	if err != nil || got != (policy.Limit{Max: 5, Window: 10 * time.Minute}) {
		t.Fatalf("parseLimit(5/10m) = %+v, %v", got, err)
	}
	for _, bad := range []string{"5", "x/1m", "5/soon", "0/1m", "5/10ms"} {
		if _, err := parseLimit("MUSTER_OVERRIDE_LIMIT", bad); err == nil {
			t.Errorf("parseLimit(%q) accepted", bad)
		}
	}
}

func TestLoadEnvPolicyLimits(t *testing.T) {
	t.Setenv("MUSTER_OVERRIDE_LIMIT", "3/1m")
	t.Setenv("MUSTER_COSIGN_WINDOW", "2m")
	var c Config
	if err := loadEnv(&c); err != nil {
		t.Fatal(err)
	}
	if c.OverrideLimit != (policy.Limit{Max: 3, Window: time.Minute}) || c.CosignWindow != 2*time.Minute ||
		c.WriteLimit != (policy.Limit{Max: policy.DefaultWriteMax, Window: policy.DefaultWriteWindow}) || c.MaxExpiry != policy.DefaultMaxExpiry {
		t.Fatalf("config %+v", c)
	}
}
