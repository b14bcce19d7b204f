package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/watch"

	livev1alpha1 "github.com/vancetope/lease-operator/api/live/v1alpha1"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
)

// holderEventJSON is one change of `list -w -o json`, a JSON object per line.
type holderEventJSON struct {
	// Type is ADDED, MODIFIED or DELETED; the holders of the list come first, as ADDED.
	Type   string     `json:"type"`
	Holder holderJSON `json:"holder"`
}

// watchHolders lists the holders matching f through the live API, prints them, and then
// prints every change as it happens (docs/live-api.md, "Watch") until ctx ends. --timeout
// bounds each list, not the watch. A watch that can no longer resume (its version expired: a
// manager restart, or another replica answered) lists again and goes on.
func watchHolders(ctx context.Context, o *options, f leasestore.HolderFilter, out outputFlag) error {
	c, err := o.live()
	if err != nil {
		return err
	}
	for {
		lctx, cancel := o.withTimeout(ctx)
		objs, rv, err := c.listHoldersAt(lctx, f)
		cancel()
		if err != nil {
			return err
		}
		holders := holdersOf(objs)
		if out.json() {
			for _, h := range holders {
				if err := writeEventJSON(o.streams.Out, watch.Added, h); err != nil {
					return err
				}
			}
		} else if err := renderHolders(o.streams.Out, time.Now(), holders); err != nil {
			return err
		}
		for {
			rv, err = c.watchHolders(ctx, f, rv, func(t watch.EventType, obj livev1alpha1.LeaseHolder) error {
				if out.json() {
					return writeEventJSON(o.streams.Out, t, holderOf(obj))
				}
				return renderHolderEvent(o.streams.Out, time.Now(), t, holderOf(obj))
			})
			if ctx.Err() != nil {
				return nil
			}
			if err != nil {
				break
			}
		}
		if !apierrors.IsResourceExpired(err) && !apierrors.IsGone(err) {
			return err
		}
		p := newPrinter(o.streams.ErrOut)
		p.printf("The watch can no longer resume (%v); listing again.\n", err)
		if err := p.done(); err != nil {
			return err
		}
	}
}

func writeEventJSON(w io.Writer, t watch.EventType, h lease.Holder) error {
	if err := json.NewEncoder(w).Encode(holderEventJSON{Type: string(t), Holder: toHolderJSON(h)}); err != nil {
		return fmt.Errorf("writing JSON: %w", err)
	}
	return nil
}

// renderHolderEvent writes one change as a row of the list's columns after its event.
func renderHolderEvent(w io.Writer, now time.Time, t watch.EventType, h lease.Holder) error {
	row := &table{tw: tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)}
	row.row(append([]string{string(t)}, holderCells(now, h)...)...)
	return row.flush()
}
