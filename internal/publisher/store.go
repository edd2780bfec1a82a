package publisher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/assembler"
)

// savedView is one service's last published view as it is kept in
// published_views; view nil means the service was removed (its row goes).
type savedView struct {
	service string
	version uint64
	view    []byte
	at      time.Time
}

// viewStore keeps each service's last published view in PostgreSQL, off
// the publishing path: the publisher hands views over (put, no I/O) and
// the save loop writes them. Only the newest view of a service matters, so
// at most one is pending per service, whatever the publication rate and
// however long PostgreSQL is away.
type viewStore struct {
	pool    *pgxpool.Pool
	timeout time.Duration

	mu      sync.Mutex
	pending map[string]savedView
}

// saveChunk bounds the views written in one transaction.
const saveChunk = 64

// put queues views for saving, each replacing any older one pending for
// its service.
func (s *viewStore) put(views []savedView) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, v := range views {
		if old, ok := s.pending[v.service]; !ok || old.version < v.version {
			s.pending[v.service] = v
		}
	}
}

func (s *viewStore) unsaved() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.pending)
}

// flush writes what is pending, in transactions of up to saveChunk views,
// each within the store's timeout. What could not be written stays pending
// unless a newer view of the same service arrived meanwhile.
func (s *viewStore) flush(ctx context.Context) error {
	s.mu.Lock()
	batch := make([]savedView, 0, len(s.pending))
	for _, v := range s.pending {
		batch = append(batch, v)
	}
	clear(s.pending)
	s.mu.Unlock()
	if len(batch) == 0 {
		return nil
	}
	// A stable order keeps concurrent writers (replicas) from
	// deadlocking on each other's rows.
	sort.Slice(batch, func(i, j int) bool { return batch[i].service < batch[j].service })
	for i := 0; i < len(batch); i += saveChunk {
		chunk := batch[i:min(i+saveChunk, len(batch))]
		if err := s.write(ctx, chunk); err != nil {
			s.put(batch[i:])
			return fmt.Errorf("save %d published views: %w", len(batch)-i, err)
		}
	}
	return nil
}

func (s *viewStore) write(ctx context.Context, chunk []savedView) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var puts []db.PublishedViewPutParams
	var dels []db.PublishedViewDeleteParams
	for _, v := range chunk {
		if v.view == nil {
			dels = append(dels, db.PublishedViewDeleteParams{Service: v.service, Version: int64(v.version)})
		} else {
			puts = append(puts, db.PublishedViewPutParams{Service: v.service, Version: int64(v.version), View: v.view, PublishedAt: v.at})
		}
	}
	return db.WithTx(ctx, s.pool, func(q *db.Queries) error {
		var errs []error
		if len(puts) > 0 {
			q.PublishedViewPut(ctx, puts).Exec(func(i int, err error) {
				if err != nil {
					errs = append(errs, fmt.Errorf("view of %s: %w", puts[i].Service, err))
				}
			})
		}
		if len(dels) > 0 {
			q.PublishedViewDelete(ctx, dels).Exec(func(i int, err error) {
				if err != nil {
					errs = append(errs, fmt.Errorf("forget the view of %s: %w", dels[i].Service, err))
				}
			})
		}
		return errors.Join(errs...)
	})
}

// load reads every saved view. A row that does not decode is reported in
// skipped and left out: a restart must not fail on one bad row.
func (s *viewStore) load(ctx context.Context) (views []*assembler.View, skipped []error, err error) {
	rows, err := db.New(s.pool).PublishedViewList(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("load published views: %w", err)
	}
	for _, r := range rows {
		var v assembler.View
		if err := json.Unmarshal(r.View, &v); err != nil {
			skipped = append(skipped, fmt.Errorf("published view of %s v%d: %w", r.Service, r.Version, err))
			continue
		}
		if v.Service != r.Service || v.Version != uint64(r.Version) {
			skipped = append(skipped, fmt.Errorf("published view of %s v%d holds %s v%d", r.Service, r.Version, v.Service, v.Version))
			continue
		}
		views = append(views, &v)
	}
	return views, skipped, nil
}

// takeEpoch returns a fresh version epoch from the publisher_epochs
// sequence: above every epoch handed out before, to any process.
func (s *viewStore) takeEpoch(ctx context.Context) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	e, err := db.New(s.pool).PublisherEpochNext(ctx)
	if err != nil {
		return 0, fmt.Errorf("take a version epoch: %w", err)
	}
	return uint64(e), nil
}
