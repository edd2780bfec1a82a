package loadgen

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestLoadgenTgsyncELBv2: the ELBv2 figure's run ends with the stand-in's
// group holding exactly what the last view routes to (elbCalls fails
// otherwise), and prints its count per 1,000 changes.
func TestLoadgenTgsyncELBv2(t *testing.T) {
	var out, errw bytes.Buffer
	err := Run(context.Background(), Env{}, []string{"tgsync", "--elbv2-only", "--endpoints", "20", "--changes", "100"}, &out, &errw)
	if err != nil {
		t.Fatalf("%v\n%s", err, errw.String())
	}
	if got := strings.Count(out.String(), "per 1,000 changes"); got != 4 {
		t.Fatalf("output:\n%s", out.String())
	}
}
