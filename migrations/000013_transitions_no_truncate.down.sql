DROP TRIGGER IF EXISTS transitions_no_truncate ON transitions;
DROP FUNCTION IF EXISTS append_only_refuse();
