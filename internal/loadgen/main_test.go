package loadgen

import (
	"testing"

	"github.com/musterhq/muster/db/dbtest"
)

// TestMain stops the test PostgreSQL cluster the route test starts.
func TestMain(m *testing.M) { dbtest.Main(m) }
