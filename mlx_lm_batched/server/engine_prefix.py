"""Prefix reuse for the server's engine: fetching a row's cached prefix, storing a finished
row's blocks, and the requests that wait for a leading row to prefill a prefix they share
(``server/prefix_leaders.py``)."""


class EnginePrefix:
    """The :class:`~.engine.Engine` methods between its rows and its prefix cache."""

    def _start_followers(self, items):
        """Start the requests that waited for a leading row (``server/prefix_leaders.py``)."""
        for job, prompts, max_tokens in items:
            if job.cancelled:
                self._unwait(job)
            else:
                self._for_this_job_only(job, self._admit, job, prompts, max_tokens)

    def _lead_done(self, row):
        """A leading row has prefilled its prompt: store its blocks, start its followers."""
        # Read in place: the store copies the blocks it keeps, and a copy of the whole
        # row first (for a row in a block of several) would sit beyond the KV bound
        # while the batch holds its reservation. The views go before the batch writes.
        cache = self.gen.extract_cache([row.uid], views=True).pop(row.uid, None)
        if cache is not None:
            self._store_prefix(row.uid, cache[1], cache[0], row.job.spec.adapter)
            del cache
        self._start_followers(self.leaders.done(row.uid))

    def _reused_tokens(self, job, prompt):
        """Tokens of ``prompt`` that ``job``'s rows will read from shared KV blocks held in
        memory (a row fetches them right after its reservation, on this thread)."""
        if not self.config.prompt_cache_size or job.scores_prompt:
            return 0
        return self.prefix.reused_tokens(prompt, getattr(job.spec, "adapter", 0))

    def _fetch_prefix(self, prompt, adapter=0):
        """(cache copy or None, tokens still to prefill) of a row on adapter slot ``adapter``."""
        if not self.config.prompt_cache_size:
            return None, list(prompt)
        return self.prefix.fetch_nearest_cache(self.model, prompt, adapter)

    def _store_prefix(self, uid, tokens, cache, adapter=0):
        """Keep row ``uid``'s cache of ``tokens`` (made on adapter slot ``adapter``) for
        later prompts on that adapter that share a prefix."""
        if self.config.prompt_cache_size and tokens:
            self.prefix.insert_cache(self.model, tokens, cache, adapter=adapter)
