package assembler_test

import (
	"testing"

	"github.com/musterhq/muster/internal/assembler"
)

// BenchmarkVersionsNext: one version per call, as Drain takes them for a
// one-service publication. The block allocator it replaced made a
// PostgreSQL round trip, under the publisher's lock, every 1,000 calls.
func BenchmarkVersionsNext(b *testing.B) {
	v, err := assembler.NewVersions(1)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := v.Next(1); err != nil {
			b.Fatal(err)
		}
	}
}
