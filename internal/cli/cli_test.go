package cli_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/musterhq/muster/internal/cli"
)

func TestParse(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		args    []string
		wantErr error
		wantOut string // on stderr
	}{
		{"flags", []string{"--data", "/tmp/x"}, nil, ""},
		{"unknown flag", []string{"--nope"}, cli.ErrUsage, "flag provided but not defined: -nope"},
		{"help", []string{"-h"}, cli.ErrUsage, "Usage of muster test"},
		{"argument", []string{"--data", "d", "extra"}, cli.ErrUsage, `muster test: unexpected argument "extra"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stderr bytes.Buffer
			fs := cli.NewFlags("test", &stderr)
			var dir string
			cli.DataFlag(fs, &dir)
			err := cli.Parse(fs, tt.args)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Parse(%q) = %v, want %v", tt.args, err, tt.wantErr)
			}
			if !strings.Contains(stderr.String(), tt.wantOut) {
				t.Errorf("stderr %q lacks %q", stderr.String(), tt.wantOut)
			}
			if tt.wantErr == nil && dir != "/tmp/x" {
				t.Errorf("--data = %q", dir)
			}
		})
	}
}
